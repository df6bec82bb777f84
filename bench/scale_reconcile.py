"""Decide-and-append latency for a proxy with a short and with a long history.

Each history is what the system writes for a proxy whose health flaps (``flapping_history``): the
prober's verdicts and the reconciler's status answering each. All histories are written
interleaved, event by event, so each proxy's events lie spread over the stream as a fleet's do.
A timed step appends one more verdict (as the prober does; not timed), then times
``Reconciler.reconcile``: read, fold, decide, append the status with optimistic concurrency.

- *before*: ``Reconciler(store, Metrics(), states=States(size=0))`` keeps nothing, so each
  decision reads and folds the proxy's whole history, as every decision did before states;
- *after*: ``Reconciler(store, Metrics())``, the default, starting from the state it kept.

Both are warmed up with one untimed reconcile of each of their proxies, then their steps are
interleaved in a new random order every round, so all see the same load and none always comes
right after the slowest. Before each timed step the garbage collector runs and the benchmark
pauses for 0.1 s (neither timed): a step that read 10,000 events would otherwise leave its
garbage, and the server's, to whichever step comes next (measured: 5 ms on the p50). A
short history uses a fresh proxy for each step, so it stays that short; a long one uses at most
a few proxies for all steps, and grows by 2 events a step (1% over 40 steps at 10,000).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.scale_fleet import (
    Filled,
    History,
    Publisher,
    cpu_seconds,
    fill_store,
    flapping_history,
    load1,
    product_server,
    server_pid,
)
from events import subjects
from events.schemas import HealthChanged
from events.store import History as Read
from events.store import NewEvent, derive_msg_id
from events.subjects import Aggregate
from services.reconciler.cache import States
from services.reconciler.service import Reconciler
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.observability.metrics import Metrics

GROWTH_TARGET = 1.5
MODES = ("before", "after")
PAUSE = 0.1
"""Seconds between timed steps, so one step does not pay for the one before."""
POOL_EVENTS = 20_000
"""Events a size may spend on fresh proxies per mode; beyond it, proxies are reused."""


class CountingStore(JetStreamEventStore):
    """The product's store, remembering how many events each read returned."""

    def __init__(self, conn: Connection) -> None:
        super().__init__(conn.nc, conn.js)
        self.reads: list[int] = []

    async def read(self, aggregate: Aggregate, after_seq: int = 0) -> Read:
        history = await super().read(aggregate, after_seq)
        self.reads.append(len(history.events))
        return history


@dataclass(frozen=True, slots=True)
class Step:
    seconds: float
    read: int
    """Events the reconcile read (all its reads)."""
    outcome: str
    load: float


@dataclass
class Case:
    size: int
    mode: str
    uids: list[str]
    steps: list[Step] = field(default_factory=list)
    client_cpu: float = 0.0
    server_cpu: float = 0.0

    def summary(self) -> dict[str, object]:
        ms = sorted(1000 * s.seconds for s in self.steps)
        n = len(ms)
        return {
            "history": self.size,
            "mode": self.mode,
            "proxies": len(self.uids),
            "reconciles": n,
            "p50_ms": round(statistics.median(ms), 2) if ms else None,
            "p90_ms": round(ms[min(n - 1, int(0.9 * n))], 2) if ms else None,
            "mean_ms": round(sum(ms) / n, 2) if ms else None,
            "events_read": statistics.median(s.read for s in self.steps) if ms else None,
            "client_cpu_ms": round(1000 * self.client_cpu / n, 2) if n else None,
            "server_cpu_ms": round(1000 * self.server_cpu / n, 2) if n else None,
            "outcomes": sorted({s.outcome for s in self.steps}),
            "load": [min(s.load for s in self.steps), max(s.load for s in self.steps)] if n else [],
        }


def pools(sizes: list[int], reconciles: int) -> dict[tuple[int, str], list[str]]:
    out: dict[tuple[int, str], list[str]] = {}
    for size in sizes:
        count = min(reconciles, max(1, POOL_EVENTS // size))
        for mode in MODES:
            out[(size, mode)] = [f"r{size}-{mode[0]}-{i:04d}" for i in range(count)]
    return out


async def fill_histories(conn: Connection, histories: list[History]) -> Filled:
    """Every history, interleaved event by event (each proxy's events stay in order)."""
    started = time.perf_counter()
    publisher = Publisher(conn.js)
    columns = [[(h.uid, event, msg_id) for event, msg_id in h.events] for h in histories]
    for row in itertools.zip_longest(*columns):
        for item in row:
            if item is not None:
                uid, event, msg_id = item
                await publisher.publish(subjects.proxy(uid).subject_for(event), event, msg_id)
    await publisher.done()
    return Filled(publisher.published, time.perf_counter() - started)


@dataclass
class ReconcileReport:
    sizes: list[int]
    fill: Filled
    cases: list[Case]

    def p50(self, size: int, mode: str) -> float:
        seconds = [
            s.seconds for c in self.cases if (c.size, c.mode) == (size, mode) for s in c.steps
        ]
        return 1000 * statistics.median(seconds) if seconds else 0.0

    def summary(self) -> dict[str, object]:
        rows = [c.summary() for c in self.cases]
        out: dict[str, object] = {"cases": rows}
        if len(self.sizes) >= 2:
            small, large = self.sizes[0], self.sizes[-1]
            for mode in MODES:
                a, b = self.p50(small, mode), self.p50(large, mode)
                out[f"growth_{mode}"] = round(b / a, 2) if a > 0 else None
        growth = out.get("growth_after")
        out["targets"] = {
            "after_growth": {
                "value": growth,
                "target": GROWTH_TARGET,
                "met": isinstance(growth, float) and growth <= GROWTH_TARGET,
            }
        }
        return out

    def as_json(self) -> dict[str, object]:
        return {
            "summary": self.summary(),
            "fill": asdict(self.fill),
            "steps": {f"{c.size}-{c.mode}": [asdict(s) for s in c.steps] for c in self.cases},
        }


async def measure(
    tmp: Path,
    sizes: list[int],
    *,
    reconciles: int,
    seed: int = 1,
    say: Callable[[str], None] = print,
) -> ReconcileReport:
    by_case = pools(sizes, reconciles)
    histories = {
        uid: flapping_history(uid, size) for (size, _), uids in by_case.items() for uid in uids
    }
    data = tmp / "reconcile"
    fill = await fill_store(data, lambda conn: fill_histories(conn, list(histories.values())))
    say(f"reconcile: filled {fill.events:,} events in {fill.seconds:,.1f} s")
    healthy = {uid: bool(h.state and h.state.healthy) for uid, h in histories.items()}
    cases = [Case(size, mode, uids) for (size, mode), uids in by_case.items()]
    async with product_server(data) as (server, conn):
        pid = server_pid(server)
        stores = {mode: CountingStore(conn) for mode in MODES}
        reconcilers = {
            "before": Reconciler(stores["before"], Metrics(), states=States(size=0)),
            "after": Reconciler(stores["after"], Metrics()),
        }
        for case in cases:  # warm-up: the "after" reconciler keeps what it folded
            for uid in case.uids:
                decision = await reconcilers[case.mode].reconcile(uid)
                if decision.outcome != "noop":
                    raise RuntimeError(f"{uid}: the filled history was not settled")
        rng = random.Random(seed)
        order = list(cases)
        for i in range(reconciles):
            rng.shuffle(order)  # so no case always follows the slow one
            for case in order:
                uid = case.uids[i % len(case.uids)]
                healthy[uid] = not healthy[uid]
                verdict = HealthChanged(
                    healthy=healthy[uid],
                    reason="Probe" if healthy[uid] else "ProbeFailed",
                    latency_ms=12.0,
                    provider_id=f"scale-{uid}",
                )
                msg_id = derive_msg_id("bench-scale-step", uid, str(i))
                store = stores[case.mode]
                await store.append(subjects.proxy(uid), [NewEvent(verdict, msg_id)])
                store.reads.clear()
                gc.collect()  # not the garbage of the step before (10,000 decoded events)
                await asyncio.sleep(PAUSE)  # nor the server's aftermath of it
                load = load1()
                client0, server0 = time.process_time(), cpu_seconds(pid)
                started = time.perf_counter()
                decision = await reconcilers[case.mode].reconcile(uid)
                seconds = time.perf_counter() - started
                case.client_cpu += time.process_time() - client0
                case.server_cpu += cpu_seconds(pid) - server0
                case.steps.append(Step(seconds, sum(store.reads), decision.outcome, load))
        for case in cases:
            row = case.summary()
            say(
                f"  history {case.size:,}, {case.mode}: p50 {row['p50_ms']} ms, "
                f"read {row['events_read']} events"
            )
    return ReconcileReport(sizes, fill, cases)
