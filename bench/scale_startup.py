"""Discovery replica start-up with a long ``LEASE`` history, without and with snapshots.

For each size the store holds ``proxies`` Ready, healthy proxies and ``lease_events`` lease
events (acquire/release pairs on random proxies, the product's codec and envelope). A start is
``egress-proxies run discovery`` as a deployment runs it, timed from creating the process to the
first ``GET /healthz`` answered 200 (discovery serves only once its views have caught up).

- *before*: the snapshot bucket (``egress-discovery-views``) is deleted first, so the replica
  folds both streams from sequence 1, as every replica did before snapshots;
- *after*: a discovery replica (``bench.scale_worker writer``) has caught up and written a
  complete pass, and was stopped; the replica restores from it.
- *empty*: a start on an empty store, once: what a start costs whatever the history (the
  interpreter, imports, the connection), the floor under both.

Every start reports the views it restored (from its own log) and its resident memory once it
answers, so a fast start that skipped work would show.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import msgspec
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from bench.scale_fleet import (
    Filled,
    Publisher,
    fill_store,
    lease_pair,
    load1,
    log_events,
    log_time,
    memory,
    product_server,
    proxy_uid,
    publish_fleet,
    ready_history,
    running,
    service_argv,
    spawn,
    stored,
    until_healthz,
)
from events import subjects
from projections import versions
from services.runtime.eventlog.snapshots import Pass
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.nats.users import KV_BUCKETS
from services.runtime.ports import free_port

BUCKET = KV_BUCKETS["discovery"]
SECONDS_TARGET = 3.0
GROWTH_TARGET = 1.5


@dataclass(frozen=True, slots=True)
class Start:
    mode: str
    seconds: float
    """Process created -> first ``/healthz`` 200."""
    rss_mb: float
    restored_views: int
    load: float
    in_service_s: float | None = None
    """From the service's "service running" log line (its own timestamp) to the ``/healthz``
    200: the start without the interpreter's start-up and the imports, which cost the same
    whatever the history."""


@dataclass
class SizeResult:
    lease_events: int
    proxies: int
    proxy_fill: Filled
    lease_fill: Filled
    writer_seconds: float = 0.0
    """From starting the writer replica until its pass covered both streams."""
    starts: list[Start] = field(default_factory=list)

    def median(self, mode: str, figure: str = "seconds") -> float:
        values = [getattr(s, figure) for s in self.starts if s.mode == mode]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else 0.0


async def fill_startup(
    conn: Connection, proxies: int, lease_events: int, seed: int
) -> tuple[Filled, Filled]:
    url = "http://127.0.0.1:3128"
    proxy_fill = await publish_fleet(
        conn.js, (ready_history(proxy_uid(i), url) for i in range(proxies))
    )
    rng = random.Random(seed)
    leases = [0] * proxies
    started = time.perf_counter()
    publisher = Publisher(conn.js)
    for _ in range(lease_events // 2):
        i = rng.randrange(proxies)
        uid = proxy_uid(i)
        for event, msg_id in lease_pair(uid, leases[i]):
            await publisher.publish(subjects.lease(uid).subject_for(event), event, msg_id)
        leases[i] += 1
    await publisher.done()
    return proxy_fill, Filled(publisher.published, time.perf_counter() - started)


async def delete_bucket(conn: Connection) -> None:
    with contextlib.suppress(BucketNotFoundError, NotFoundError):
        await conn.js.delete_key_value(BUCKET)


async def start_once(server: EmbeddedNatsServer, mode: str, log: Path, timeout: float) -> Start:
    port = free_port()
    argv = service_argv("discovery", server.url, 0, "--port", str(port))
    load = load1()
    async with running("discovery", argv, log) as child:
        seconds = await until_healthz(child, port, timeout)
        answered = datetime.now(UTC)
        rss = memory(child.pid).get("VmRSS", 0.0)
    running_at = log_time(log, "service running")
    in_service = (answered - running_at).total_seconds() if running_at else None
    restored = sum(
        int(str(r.get("views", 0))) for r in log_events(log, "views restored from snapshots")
    )
    return Start(mode, round(seconds, 3), rss, restored, load, in_service)


async def pass_covers(conn: Connection) -> bool:
    """Whether both views' pass keys are complete as of each stream's last sequence."""
    try:
        kv = await conn.js.key_value(BUCKET)
    except (BucketNotFoundError, NotFoundError):
        return False
    for name, version, stream in (
        ("proxy", versions.PROXY, subjects.PROXY_STREAM),
        ("lease", versions.LEASE, subjects.LEASE_STREAM),
    ):
        try:
            entry = await kv.get(f"{name}.v{version}.pass")
        except (KeyNotFoundError, NotFoundError):
            return False
        marker = msgspec.msgpack.decode(entry.value or b"", type=Pass)
        info = await conn.js.stream_info(stream)
        if marker.as_of < info.state.last_seq:
            return False
    return True


async def write_pass(
    server: EmbeddedNatsServer, conn: Connection, log: Path, interval: float, timeout: float
) -> float:
    """Start a writer replica, wait for a pass covering both streams, stop it."""
    argv = [sys.executable, "-m", "bench.scale_worker", "writer", server.url]
    argv += ["--snapshot-interval", str(interval)]
    child = await spawn("writer", argv, log)
    try:
        deadline = time.perf_counter() + timeout
        while not await pass_covers(conn):
            child.check_alive()
            if time.perf_counter() > deadline:
                raise TimeoutError(f"no snapshot pass within {timeout:.0f} s; see {log}")
            await asyncio.sleep(0.1)
        return time.perf_counter() - child.started
    finally:
        await child.stop()


async def measure_size(
    tmp: Path,
    lease_events: int,
    *,
    proxies: int,
    starts: int,
    writer_interval: float,
    timeout: float,
    seed: int = 1,
    say: Callable[[str], None] = print,
) -> SizeResult:
    data = tmp / f"startup-{lease_events}"
    proxy_fill, lease_fill = await fill_store(
        data, lambda conn: fill_startup(conn, proxies, lease_events, seed)
    )
    say(
        f"start-up, {lease_events:,} lease events: filled {lease_fill.events:,} in "
        f"{lease_fill.seconds:,.1f} s ({lease_fill.rate:,.0f}/s), {proxies:,} proxies "
        f"({proxy_fill.events:,} events) in {proxy_fill.seconds:,.1f} s"
    )
    result = SizeResult(lease_events, proxies, proxy_fill, lease_fill)
    async with product_server(data) as (server, conn):
        if await stored(conn.js, subjects.LEASE_STREAM) != lease_fill.events:
            raise RuntimeError("the LEASE stream lost events across the restart")
        for r in range(starts):
            await delete_bucket(conn)
            log = tmp / f"discovery-{lease_events}-before-{r}.log"
            start = await start_once(server, "before", log, timeout)
            result.starts.append(start)
            say(f"  before #{r + 1}: {start.seconds:.2f} s (load {start.load})")
        await delete_bucket(conn)
        log = tmp / f"writer-{lease_events}.log"
        result.writer_seconds = await write_pass(server, conn, log, writer_interval, timeout)
        say(f"  snapshot pass written {result.writer_seconds:.1f} s after the writer started")
        for r in range(starts):
            log = tmp / f"discovery-{lease_events}-after-{r}.log"
            start = await start_once(server, "after", log, timeout)
            result.starts.append(start)
            say(f"  after #{r + 1}: {start.seconds:.2f} s (load {start.load})")
    return result


async def empty_floor(tmp: Path, starts: int, timeout: float) -> list[Start]:
    """Start-ups on an empty store: the part of a start no history can explain."""
    out: list[Start] = []
    async with product_server(tmp / "startup-empty") as (server, _):
        for r in range(starts):
            out.append(await start_once(server, "empty", tmp / f"discovery-empty-{r}.log", timeout))
    return out


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


@dataclass
class StartupReport:
    sizes: list[SizeResult]
    empty: list[Start]

    def summary(self) -> dict[str, object]:
        rows = [
            {
                "lease_events": s.lease_events,
                "proxies": s.proxies,
                "lease_fill_seconds": round(s.lease_fill.seconds, 1),
                "lease_fill_rate": round(s.lease_fill.rate),
                "before_s": round(s.median("before"), 3),
                "after_s": round(s.median("after"), 3),
                "before_in_service_s": round(s.median("before", "in_service_s"), 3),
                "after_in_service_s": round(s.median("after", "in_service_s"), 3),
                "before_restored_views": max(
                    (x.restored_views for x in s.starts if x.mode == "before"), default=0
                ),
                "after_restored_views": min(
                    (x.restored_views for x in s.starts if x.mode == "after"), default=0
                ),
                "after_rss_mb": statistics.median(
                    [x.rss_mb for x in s.starts if x.mode == "after"] or [0.0]
                ),
                "before_rss_mb": statistics.median(
                    [x.rss_mb for x in s.starts if x.mode == "before"] or [0.0]
                ),
                "loads": [x.load for x in s.starts],
                "writer_seconds": round(s.writer_seconds, 1),
            }
            for s in self.sizes
        ]
        out: dict[str, object] = {
            "sizes": rows,
            "empty_s": median([s.seconds for s in self.empty]),
            "empty_in_service_s": median([s.in_service_s for s in self.empty]),
        }
        if len(self.sizes) >= 2:
            small, large = self.sizes[0], self.sizes[-1]
            for mode in ("before", "after"):
                a, b = small.median(mode), large.median(mode)
                out[f"growth_{mode}"] = round(b / a, 2) if a else None
                a, b = small.median(mode, "in_service_s"), large.median(mode, "in_service_s")
                out[f"growth_{mode}_in_service"] = round(b / a, 2) if a else None
        after = [s.median("after") for s in self.sizes]
        growth = out.get("growth_after")
        out["targets"] = {
            "after_seconds": {
                "value": max(after) if after else None,
                "target": SECONDS_TARGET,
                "met": bool(after) and max(after) <= SECONDS_TARGET,
            },
            "after_growth": {
                "value": growth,
                "target": GROWTH_TARGET,
                "met": isinstance(growth, float) and growth <= GROWTH_TARGET,
            },
        }
        return out

    def as_json(self) -> dict[str, object]:
        return {
            "summary": self.summary(),
            "sizes": [asdict(s) for s in self.sizes],
            "empty": [asdict(s) for s in self.empty],
        }


async def measure(
    tmp: Path,
    sizes: list[int],
    *,
    proxies: int,
    starts: int,
    writer_interval: float,
    timeout: float,
    seed: int = 1,
    say: Callable[[str], None] = print,
) -> StartupReport:
    empty = await empty_floor(tmp, starts, timeout)
    say(f"start-up on an empty store: {statistics.median(s.seconds for s in empty):.2f} s")
    results = [
        await measure_size(
            tmp,
            size,
            proxies=proxies,
            starts=starts,
            writer_interval=writer_interval,
            timeout=timeout,
            seed=seed,
            say=say,
        )
        for size in sizes
    ]
    return StartupReport(results, empty)
