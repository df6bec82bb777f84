"""The pool decider's cost per evaluation, without servers: ``decide`` on a pool of N members, all
Ready, with nothing to do (the steady state every tick of the controller meets); and the whole of
such a tick (``services.pools.service.tick``) on an in-memory store, to tell how much of the
controller's CPU at steady state is the decider.

``decide`` looks at every member, so an evaluation is O(members) by nature; what must stay flat
from 100 to 10,000 members is the cost *per member*. The view is built as the controller builds
it: ``PoolDeclared`` and then ``PoolDecided`` events of at most 100 members each, made by
``decide`` itself, folded by ``projections.pool.apply`` as ``Recorded`` items. Two specs are
measured: the plain one (no recycling), and one with ``maxAge`` and ``recycleOnBlocks`` set, which
turns on the recycling pass (a second look at every member).

Run: ``python -m bench.pools_decide [--sizes 100 1000 10000] [--profile N] [--tick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from events import subjects
from events.pool import PoolDecided, PoolDeclared, PoolSpec
from events.poolresource import pool_uid
from events.schemas import Phase, Placement, ProxySpec
from events.store import NewEvent, Recorded, derive_msg_id
from projections import pool as pool_fold
from projections.pool import PoolView
from projections.pool_members import MemberState
from projections.proxy import ProxyView
from services.pools.controller import Controller, source_of
from services.pools.pure.decide import decide
from services.pools.pure.members import member_spec
from services.pools.service import PoolMetrics, tick
from services.runtime.eventlog.memory import InMemoryEventStore

SIZES = (100, 1_000, 10_000)
FLAT_TARGET = 1.5
"""Per-member cost at the largest size over the smallest: above this, it is not flat."""
SPECS = {
    "plain": {},
    "recycling": {"max_age_seconds": 6 * 3600.0, "recycle_on_blocks": 3},
}


def _recorded(event: PoolDeclared | PoolDecided, seq: int, at: datetime, uid: str) -> Recorded:
    subject = f"pool.{uid}.{event.category}"
    return Recorded(event=event, seq=seq, subject=subject, timestamp=at)


def _state(pool: PoolView, uid: str, since: datetime) -> MemberState:
    planned = pool.members[uid]
    return MemberState(
        uid=uid,
        declared=True,
        phase="Ready",
        ready=True,
        healthy=True,
        since=since,
        spec=member_spec(pool.name, pool.spec, planned.member),
    )


def steady_pool(
    size: int, kind: str = "plain", events: list[PoolDeclared | PoolDecided] | None = None
) -> tuple[PoolView, dict[str, MemberState]]:
    """A pool of ``size`` members, every one Ready, folded from the decisions ``decide`` made
    (which are also put in ``events``, when given)."""
    now = datetime(2026, 12, 1, tzinfo=UTC)
    uid = pool_uid("bench", "decide")
    template = ProxySpec(provider="fake", placement=Placement(zone="a"))
    spec = PoolSpec(replicas=size, template=template, **SPECS[kind])  # type: ignore[arg-type]
    declared = PoolDeclared(uid=uid, namespace="bench", name="decide", spec=spec)
    pool = pool_fold.apply(None, _recorded(declared, 1, now, uid))
    log = events if events is not None else []
    log.append(declared)
    states: dict[str, MemberState] = {}
    seq = 1
    while (decision := decide(pool, states, now)) is not None:
        if decision.reason != "ScaleUp":
            raise RuntimeError(f"building the pool, decide said {decision.reason}, not ScaleUp")
        seq += 1
        event = PoolDecided(
            uid=uid, reason=decision.reason, added=decision.added, figures=decision.figures
        )
        pool = pool_fold.apply(pool, _recorded(event, seq, now, uid))
        log.append(event)
        states.update({m.uid: _state(pool, m.uid, now - timedelta(hours=1)) for m in event.added})
    if len(pool.active()) != size or len(states) != size:
        raise RuntimeError(f"built {len(pool.active())} members, not {size}")
    return pool, states


def _time(call: Callable[[], object], budget: float = 0.3, repeats: int = 5) -> list[float]:
    """Seconds per call, per repeat: enough calls in each repeat to fill ``budget`` seconds."""
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    calls = max(1, int(budget / once))
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        out.append((time.perf_counter() - start) / calls)
    return out


def measure(sizes: tuple[int, ...] = SIZES, budget: float = 0.3) -> dict[str, dict[str, Any]]:
    """Per spec and size: µs per evaluation and per member (best and median of 5 repeats; the
    best is the least disturbed by the other work on a shared machine)."""
    now = datetime(2026, 12, 1, tzinfo=UTC)
    out: dict[str, dict[str, Any]] = {}
    for kind in SPECS:
        rows = []
        for size in sizes:
            pool, states = steady_pool(size, kind)
            if decide(pool, states, now) is not None:
                raise RuntimeError("a pool at its size, all Ready, still has something to do")
            seconds = _time(lambda p=pool, s=states: decide(p, s, now), budget)  # type: ignore[misc]
            best, median = min(seconds), statistics.median(seconds)
            rows.append(
                {
                    "members": size,
                    "us_per_evaluation": round(1e6 * best, 1),
                    "us_per_evaluation_median": round(1e6 * median, 1),
                    "us_per_member": round(1e6 * best / size, 3),
                    "us_per_member_median": round(1e6 * median / size, 3),
                }
            )
        first, last = rows[0]["us_per_member"], rows[-1]["us_per_member"]
        growth = last / first if first else 0.0
        out[kind] = {
            "sizes": rows,
            "per_member_growth": round(growth, 2),
            "flat": growth <= FLAT_TARGET,
            "target": FLAT_TARGET,
        }
    return out


async def _steady_tick(size: int) -> tuple[Controller, Any, PoolMetrics]:
    """The controller's inputs at steady state: the pool's history in an in-memory store, the
    pool folded from it, and a Ready proxy view per member as the pool declared it."""
    events: list[PoolDeclared | PoolDecided] = []
    pool, _ = steady_pool(size, events=events)
    store = InMemoryEventStore()
    for i, event in enumerate(events):
        await store.append(subjects.pool(pool.uid), [NewEvent(event, derive_msg_id(str(i)))])
    pool = pool_fold.fold(list((await store.read(subjects.pool(pool.uid))).events)) or pool
    at = datetime.now(UTC) - timedelta(hours=1)
    proxies = {
        p.member.uid: ProxyView(
            uid=p.member.uid,
            namespace=pool.namespace,
            name=p.member.name,
            spec=member_spec(pool.name, pool.spec, p.member),
            generation=1,
            observed_generation=1,
            phase=Phase.READY,
            healthy=True,
            source=source_of(pool),
            created_at=at,
        )
        for p in pool.active()
    }

    def views(found: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(views=found)

    held = SimpleNamespace(
        pools=views({pool.uid: pool}), proxies=views(proxies), leases=views({}), demand=views({})
    )
    return Controller(store), held, PoolMetrics(CollectorRegistry())


async def measure_tick(sizes: tuple[int, ...] = SIZES, budget: float = 0.3) -> dict[str, Any]:
    """One steady-state tick of ``run pools`` minus NATS's round trips: every member's state
    (twice: the evaluation, the gauges), the pool's history read and folded, ``decide``, and
    the check that every member is declared as planned. Best of 5 repeats, as ``measure``."""
    rows: list[dict[str, float]] = []
    for size in sizes:
        controller, views, metrics = await _steady_tick(size)
        start = time.perf_counter()
        outcomes = await tick(controller, views, metrics)
        calls = max(1, int(budget / max(time.perf_counter() - start, 1e-7)))
        if [o.decision for o in outcomes] != [None] or outcomes[0].declared:
            raise RuntimeError("a pool at its size, all Ready, still had something to do")
        repeats = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                await tick(controller, views, metrics)
            repeats.append((time.perf_counter() - start) / calls)
        best = min(repeats)
        rows.append(
            {
                "members": size,
                "ms_per_tick": round(1e3 * best, 3),
                "us_per_member": round(1e6 * best / size, 3),
            }
        )
    growth = rows[-1]["us_per_member"] / rows[0]["us_per_member"]
    return {"sizes": rows, "per_member_growth": round(growth, 2)}


def profile_tick(size: int, top: int = 15) -> str:
    async def run() -> cProfile.Profile:
        controller, views, metrics = await _steady_tick(size)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(max(1, 100_000 // size)):
            await tick(controller, views, metrics)
        profiler.disable()
        return profiler

    text = io.StringIO()
    pstats.Stats(asyncio.run(run()), stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def profile(size: int, kind: str = "plain", top: int = 12) -> str:
    """Where one evaluation's time goes at ``size`` members (cumulative, the busiest first)."""
    pool, states = steady_pool(size, kind)
    now = datetime(2026, 12, 1, tzinfo=UTC)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(max(1, 200_000 // size)):
        decide(pool, states, now)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pools_decide", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--profile", type=int, help="also profile decide at this many members")
    parser.add_argument("--kind", choices=list(SPECS), default="plain")
    parser.add_argument("--tick", action="store_true", help="the whole tick, not decide alone")
    args = parser.parse_args()
    if args.tick:
        print(json.dumps(asyncio.run(measure_tick(tuple(args.sizes))), indent=2))
        if args.profile:
            print(profile_tick(args.profile))
        return
    print(json.dumps(measure(tuple(args.sizes)), indent=2))
    if args.profile:
        print(profile(args.profile, args.kind))


if __name__ == "__main__":
    main()
