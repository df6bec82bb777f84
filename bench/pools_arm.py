"""The pool arm of ``bench.pools``: one ``PoolDeclared`` of N members, the pool controller as its
own OS process (``run pools``, exactly as a deployment starts it), until all N members are Ready.

The fleet is ``bench.lifecycle``'s (a fresh nats-server with the product's configuration, one
executor with the zero-latency fake, one reconciler), so the only difference from declaring N
Proxies by hand is who declares them: the controller, in decisions of at most 100 members, one
decision per ``--pool-interval``. Afterwards the log must show every member planned once, each
declared once, one instance each; then the controller is left alone at N for a while, to measure
what its ticks cost when there is nothing to do (every tick still looks at every member).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from bench.lifecycle import ReadyCount
from bench.lifecycle_worker import ROOT, Options, bound, cpu_seconds, fleet
from events import subjects
from events.pool import PoolDecided, PoolDeclared, PoolSpec
from events.poolresource import pool_uid
from events.schemas import (
    CreateInstance,
    InstanceObserved,
    InstanceState,
    Placement,
    ProxyDeclared,
    ProxySpec,
)
from events.store import NewEvent, Recorded, derive_msg_id
from projections import pool as pool_fold
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.projector import Projector
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import connect

NAMESPACE = "bench"
POOL = "bench"
FOLLOWED = (subjects.POOL_STREAM, subjects.PROXY_STREAM, subjects.LEASE_STREAM)
"""The streams the controller folds, each followed by push once it has caught up."""


@dataclass(frozen=True, slots=True)
class PoolOptions:
    interval: float = 1.0
    """The controller's ``--pool-interval``; 1 s is the product's default."""
    idle: float = 10.0
    """Seconds at N, nothing to do, over which the controller's ticks are measured (0: skip)."""
    settle: float = 2.0
    profile: Path | None = None
    """Write the controller's cProfile stats here when it stops."""


@dataclass(frozen=True, slots=True)
class Tally:
    declared: int = 0
    creates: int = 0
    running: int = 0


def tally(current: Tally | None, recorded: Recorded) -> Tally:
    t = current or Tally()
    match recorded.event:
        case ProxyDeclared():
            return Tally(t.declared + 1, t.creates, t.running)
        case CreateInstance():
            return Tally(t.declared, t.creates + 1, t.running)
        case InstanceObserved(state=InstanceState.RUNNING):
            return Tally(t.declared, t.creates, t.running + 1)
        case _:
            return t


async def read_up_to(projector: Projector[Tally], seq: int, timeout: float) -> None:
    """As ``bench.lifecycle.read_up_to``: every event up to ``seq``, not a no-wait catch-up that
    may return before a busy server answers (a check that read nothing finds nothing wrong)."""
    try:
        async with asyncio.timeout(timeout):
            while projector.last_seq < seq:
                await projector.step()
    finally:
        await projector.close()


@dataclass
class PoolRun:
    members: int
    seconds: float
    half_seconds: float
    ready: int
    cpu: dict[str, float] = field(default_factory=dict)
    checks: dict[str, object] = field(default_factory=dict)
    idle: dict[str, Any] = field(default_factory=dict)
    load: float = 0.0


def template() -> ProxySpec:
    """The spec ``bench.lifecycle`` declares by hand: the fake provider in zone a."""
    return ProxySpec(provider="fake", placement=Placement(zone="a"))


async def spawn_pools(
    url: str, interval: float, log: Path, profile: Path | None = None
) -> asyncio.subprocess.Process:
    """``run pools`` as a deployment runs it (its own NATS user, uvloop, no metrics port so runs
    cannot collide); tracing off, as for the other workers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    profiled = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    args = [sys.executable, *profiled, "-m", "services.cli.main", "run", "pools", "--nats-url", url]
    args += ["--pool-interval", str(interval), "--metrics-port", "0"]
    with log.open("ab") as err:
        return await asyncio.create_subprocess_exec(
            *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=err
        )


async def following(js: JetStreamContext, process: asyncio.subprocess.Process, log: Path) -> None:
    """Until the controller has caught up and follows all three streams by push (a consumer with
    a deliver subject on each: nothing else in this fleet reads by push), so its start-up is
    not inside the clock."""
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise RuntimeError(f"the pools process exited ({process.returncode}); see {log}")
        pushed = 0
        for stream in FOLLOWED:
            with contextlib.suppress(NotFoundError):
                infos = await js.consumers_info(stream)
                pushed += any(i.config.deliver_subject for i in infos)
        if pushed == len(FOLLOWED):
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"the pools process did not follow {FOLLOWED} in 60 s; see {log}")


async def stop(process: asyncio.subprocess.Process) -> int:
    if process.returncode is None:
        process.terminate()
    try:
        return await asyncio.wait_for(process.wait(), 30.0)
    except TimeoutError:
        process.kill()
        return await process.wait()


async def pool_checks(
    store: JetStreamEventStore, uid: str, count: int, proxies: dict[str, Tally]
) -> dict[str, object]:
    """What the log says was done: every member planned once (across all decisions), none
    retired, each a Proxy declared once with one CreateInstance and one Running observation."""
    history = await store.read(subjects.pool(uid))
    decisions = [r.event for r in history.events if isinstance(r.event, PoolDecided)]
    added = [m.uid for d in decisions for m in d.added]
    view = pool_fold.fold(list(history.events))
    if view is None:
        raise RuntimeError("the pool is not in the log")
    members = {p.member.uid for p in view.active()}
    return {
        "decisions": len(decisions),
        "reasons": sorted({d.reason for d in decisions}),
        "planned": len(added),
        "planned_distinct": len(set(added)),
        "active": len(members),
        "retired": len(view.retired()),
        "unusable": view.unusable,
        "proxies": len(proxies),
        "proxies_are_members": set(proxies) == members,
        "declared_once": sum(t.declared == 1 for t in proxies.values()),
        "one_create": sum(t.creates == 1 for t in proxies.values()),
        "one_running": sum(t.running == 1 for t in proxies.values()),
    }


def exact(checks: dict[str, object], fake: dict[str, object], count: int) -> bool:
    per_member = ("planned", "planned_distinct", "active", "proxies")
    per_proxy = ("declared_once", "one_create", "one_running")
    return (
        all(checks.get(k) == count for k in per_member + per_proxy)
        and checks.get("retired") == checks.get("unusable") == 0
        and checks.get("proxies_are_members") is True
        and fake.get("created_total") == fake.get("owners") == count
        and fake.get("max_live_per_owner") == 1
    )


async def run_pool(tmp: Path, count: int, options: Options, pool: PoolOptions) -> PoolRun:
    """One timed run: declare the pool, wait for its last member to be Ready."""
    async with fleet(tmp, 1, options) as running:
        conn = await connect(running.server.url, name="bench")
        log = tmp / "pools.log"
        process = await spawn_pools(running.server.url, pool.interval, log, pool.profile)
        try:
            await ensure_streams(conn.js)
            await bound(conn.js, "executor", 1)
            await bound(conn.js, "reconciler", 1)
            await following(conn.js, process, log)
            store = JetStreamEventStore(conn.nc, conn.js)
            counted = ReadyCount()
            ready = Projector(conn.js, subjects.PROXY_STREAM, "proxy.*.*", counted.apply)
            await ready.catch_up()
            uid = pool_uid(NAMESPACE, POOL)
            spec = PoolSpec(replicas=count, template=template())
            declared = PoolDeclared(uid=uid, namespace=NAMESPACE, name=POOL, spec=spec)
            pids = {**running.pids(), "pools": process.pid}
            cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
            load, bench0 = os.getloadavg()[0], time.process_time()
            start = time.perf_counter()
            await store.append(subjects.pool(uid), [NewEvent(declared, derive_msg_id(uid))], 0)
            half = 0.0
            while counted.ready < count and time.perf_counter() - start < options.timeout:
                if process.returncode is not None:
                    raise RuntimeError(f"the pools process exited; see {log}")
                await ready.step()
                now = time.perf_counter() - start
                half = half or (now if 2 * counted.ready >= count else 0.0)
            seconds = time.perf_counter() - start
            cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
            cpu["bench"] = time.process_time() - bench0
            done = counted.ready
            await ready.close()
            log_tally = Projector(conn.js, subjects.PROXY_STREAM, "proxy.*.*", tally)
            info = await conn.js.stream_info(subjects.PROXY_STREAM)
            await read_up_to(log_tally, info.state.last_seq, options.timeout)
            checks = await pool_checks(store, uid, count, log_tally.views)
            idle = await measure_idle(pids, count, pool) if pool.idle > 0 else {}
        finally:
            await conn.close()
            code = await stop(process)
        if code != 0:
            raise RuntimeError(f"the pools process ended with {code}; see {log}")
        reports = [await w.stop() for w in running.workers]
    fake = next((r["fake"] for r in reports if r.get("role") == "executor"), {})
    fake = fake if isinstance(fake, dict) else {}
    checks["fake"] = fake
    checks["exact"] = exact(checks, fake, count)
    return PoolRun(
        members=count,
        seconds=seconds,
        half_seconds=half or seconds,
        ready=done,
        cpu={k: round(v, 3) for k, v in cpu.items()},
        checks=checks,
        idle=idle,
        load=load,
    )


async def measure_idle(pids: dict[str, int], count: int, pool: PoolOptions) -> dict[str, Any]:
    """CPU over ``pool.idle`` seconds at N with nothing to do. The controller evaluates every
    pool once per tick and sleeps ``interval`` between ticks, so the window holds about
    idle / interval ticks (a tick's own duration makes it slightly fewer: the figure per tick
    is, if anything, low by that fraction)."""
    await asyncio.sleep(pool.settle)
    cpu0 = {n: cpu_seconds(pid) for n, pid in pids.items()}
    bench0, start = time.process_time(), time.perf_counter()
    await asyncio.sleep(pool.idle)
    seconds = time.perf_counter() - start
    cpu = {n: cpu_seconds(pid) - cpu0[n] for n, pid in pids.items()}
    cpu["bench"] = time.process_time() - bench0
    ticks = seconds / pool.interval
    per_tick = 1000 * cpu["pools"] / ticks
    return {
        "seconds": round(seconds, 2),
        "interval": pool.interval,
        "ticks": round(ticks, 1),
        "cpu_seconds": {n: round(v, 3) for n, v in cpu.items()},
        "cpu_ms_per_second": {n: round(1000 * v / seconds, 2) for n, v in cpu.items()},
        "pools_cores": round(cpu["pools"] / seconds, 4),
        "pools_ms_per_tick": round(per_tick, 2),
        "pools_us_per_member_per_tick": round(1000 * per_tick / count, 2),
        "server_ms_per_tick": round(1000 * cpu["nats-server"] / ticks, 2),
    }
