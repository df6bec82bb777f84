"""Time travel from checkpoints at fleet scale: ``proxies`` Ready proxies and ``lease_events``
LEASE events (acquire/release pairs on random proxies, ``bench.scale_startup``'s fill), the
checkpoints written, then the fleet (PROXY, LEASE and POOL) folded at random instants.

Measured, all as CPU time of this process (``time.process_time``; nats-server is another
process and not counted):

- the writer: what discovery's checkpoint writer spends per event folded and written, and the
  bytes the checkpoints take in their buckets (``KV_egress-checkpoints-*``);
- the reader: one fleet time travel (``checkpoints.fold_at`` for the three streams, what the
  console's ``?at=`` and ``get --at`` run) per random instant: median and max CPU seconds, the
  checkpoint used and the events read after it;
- a full replay from the first event (``read_until`` from sequence 1, no limit) at a few of the
  instants: its CPU, and that its views equal the checkpointed travel's, stream by stream.

Run: ``python -m bench.timetravel`` (10,000 proxies, 10^6 LEASE events; about 10 minutes on a
loaded 2-core VM, most of it the fill, the writer and the replays), ``--lease-events 100000``
for a quicker run, ``--full-ratio`` to try another ``cp.FULL_RATIO`` (set in this process for
the writer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.scale_fleet import Filled, fill_store, product_server
from bench.scale_startup import fill_startup
from services.runtime.eventlog.asof import ByProxy, read_until
from services.runtime.eventlog.checkpoint_writer import CheckpointWriter
from services.runtime.eventlog.checkpoints import (
    EVERY,
    LEASE,
    TRAVELS,
    Travel,
    Travelled,
    fold_at,
    stream_bounds,
)
from services.runtime.eventlog.pure import checkpoint as cp
from services.runtime.nats.connection import Connection

TARGET_CPU = 1.0
"""Seconds of CPU one time travel may take, worst case (issue 40's target)."""
TARGET_BYTES = 0.3
"""Checkpoint bytes per byte of the LEASE events at most (issue 40's target)."""


@dataclass(frozen=True, slots=True)
class Config:
    proxies: int = 10_000
    lease_events: int = 1_000_000
    every: int = EVERY
    instants: int = 20
    replays: int = 3
    seed: int = 1
    full_ratio: float = cp.FULL_RATIO
    """When the writer starts a new chain (``cp.FULL_RATIO``): the trade between bytes and CPU."""


@dataclass(frozen=True, slots=True)
class Written:
    stream: str
    folded: int
    written: int
    fulls: int
    full_bytes: int
    """Of the checkpoints' packed bytes, the full ones'."""
    cpu: float
    seconds: float
    stored_bytes: int
    """What the stream's checkpoint bucket holds on the server."""
    stream_bytes: int = 0
    """What the stream's events take, to compare."""

    @property
    def cpu_per_event_us(self) -> float:
        return self.cpu / self.folded * 1e6 if self.folded else 0.0


@dataclass(frozen=True, slots=True)
class Instant:
    at: str
    cpu: float
    read: int
    """Messages read after the checkpoints, over the three streams."""
    checkpoints: dict[str, int]
    deltas: dict[str, int] = field(default_factory=dict)
    """Per stream, the delta checkpoints applied after the full one."""
    replay_cpu: float | None = None
    same_as_replay: bool | None = None


@dataclass
class Report:
    config: Config
    fill: dict[str, Any] = field(default_factory=dict)
    written: list[Written] = field(default_factory=list)
    instants: list[Instant] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        cpus = [i.cpu for i in self.instants]
        replays = [i for i in self.instants if i.replay_cpu is not None]
        return {
            "travel_cpu_median_s": round(statistics.median(cpus), 3) if cpus else None,
            "travel_cpu_max_s": round(max(cpus), 3) if cpus else None,
            "replay_cpu_s": [round(i.replay_cpu or 0.0, 3) for i in replays],
            "all_same_as_replay": all(i.same_as_replay for i in replays),
            "writer_cpu_per_event_us": {
                w.stream: round(w.cpu_per_event_us, 1) for w in self.written
            },
            "checkpoint_bytes": {w.stream: w.stored_bytes for w in self.written},
            "event_bytes": {w.stream: w.stream_bytes for w in self.written},
            "checkpoints": {w.stream: w.written for w in self.written},
            "full_checkpoints": {w.stream: w.fulls for w in self.written},
            "full_checkpoint_bytes": {w.stream: w.full_bytes for w in self.written},
            "lease_bytes_ratio": next(
                (
                    round(w.stored_bytes / w.stream_bytes, 3)
                    for w in self.written
                    if w.stream == LEASE.stream and w.stream_bytes
                ),
                None,
            ),
            "writer_cpu_s": {w.stream: round(w.cpu, 1) for w in self.written},
            "target_cpu_s": TARGET_CPU,
            "target_bytes_ratio": TARGET_BYTES,
        }


async def bucket_bytes(conn: Connection, travel: Travel[Any]) -> int:
    info = await conn.js.stream_info(f"KV_{travel.bucket}")
    return int(info.state.bytes or 0)


async def write_all(conn: Connection, every: int) -> list[Written]:
    """Every stream's checkpoints, as discovery's writer writes them, one stream at a time."""
    out = []
    for travel in TRAVELS:
        writer: CheckpointWriter[Any] = CheckpointWriter(conn.js, travel, every=every)
        last = (await stream_bounds(conn.js, travel.stream)).last
        cpu, started = time.process_time(), time.perf_counter()
        await writer.follow(until_seq=last)
        cpu, seconds = time.process_time() - cpu, time.perf_counter() - started
        s = writer.stats
        stored = await bucket_bytes(conn, travel)
        events = int((await conn.js.stream_info(travel.stream)).state.bytes or 0)
        out.append(
            Written(
                travel.stream,
                s.folded,
                s.written,
                s.fulls,
                s.full_bytes,
                cpu,
                seconds,
                stored,
                events,
            )
        )
    return out


async def span(conn: Connection) -> tuple[datetime, datetime]:
    """The server times of the LEASE stream's first and last events."""
    bounds = await stream_bounds(conn.js, LEASE.stream)
    first = await conn.js.get_msg(LEASE.stream, seq=max(bounds.first, 1))
    last = await conn.js.get_msg(LEASE.stream, seq=bounds.last)
    assert first.time is not None
    assert last.time is not None
    return first.time, last.time


async def travel(conn: Connection, at: datetime) -> tuple[dict[str, Travelled[Any]], float]:
    """The fleet at ``at`` as the console folds it, and the CPU it took."""
    cpu = time.process_time()
    got = {t.stream: await fold_at(conn.js, t, at) for t in TRAVELS}
    return got, time.process_time() - cpu


async def replay(conn: Connection, at: datetime) -> tuple[dict[str, dict[str, Any]], float]:
    """The fleet at ``at`` folded from every stream's first event, without a limit."""
    cpu = time.process_time()
    out = {}
    for t in TRAVELS:
        views = ByProxy(t.apply, t.stream)
        await read_until(conn.js, t.stream, t.filter_subject, at, limit=10**9, each=views.fold)
        out[t.stream] = views.views
    return out, time.process_time() - cpu


def instants(rng: random.Random, first: datetime, last: datetime, n: int) -> list[datetime]:
    width = (last - first).total_seconds()
    return sorted(first + timedelta(seconds=rng.uniform(0, width)) for _ in range(n))


async def measure(config: Config, workdir: Path, say: Any = print) -> Report:
    report = Report(config)

    async def fill(conn: Connection) -> tuple[Filled, Filled]:
        return await fill_startup(conn, config.proxies, config.lease_events, config.seed)

    say(f"filling {config.proxies} proxies and {config.lease_events} LEASE events")
    proxies, leases = await fill_store(workdir, fill)
    report.fill = {"proxies": asdict(proxies), "leases": asdict(leases)}
    async with product_server(workdir) as (_server, conn):
        say("writing checkpoints")
        cp.FULL_RATIO = config.full_ratio
        report.written = await write_all(conn, config.every)
        for w in report.written:
            say(f"  {w.stream}: {w.written} written, {w.cpu_per_event_us:.1f} us CPU per event")
        rng = random.Random(config.seed)
        first, last = await span(conn)
        chosen = instants(rng, first, last, config.instants)
        compare = set(rng.sample(range(len(chosen)), min(config.replays, len(chosen))))
        for index, at in enumerate(chosen):
            got, cpu = await travel(conn, at)
            item = Instant(
                at.isoformat(),
                cpu,
                sum(t.read for t in got.values()),
                {stream: t.checkpoint for stream, t in got.items()},
                {stream: t.deltas for stream, t in got.items()},
            )
            if index in compare:
                views, replay_cpu = await replay(conn, at)
                same = all(views[s] == got[s].views for s in views)
                item = Instant(
                    item.at, cpu, item.read, item.checkpoints, item.deltas, replay_cpu, same
                )
            say(
                f"  {at.isoformat()}: {cpu:.3f} s CPU, {item.read} read, {item.checkpoints}, "
                f"deltas {item.deltas}"
            )
            report.instants.append(item)
    return report


def as_json(report: Report) -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        },
        "config": asdict(report.config),
        "fill": report.fill,
        "summary": report.summary(),
        "written": [asdict(w) | {"cpu_per_event_us": w.cpu_per_event_us} for w in report.written],
        "instants": [asdict(i) for i in report.instants],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.timetravel", description=__doc__)
    parser.add_argument("--proxies", type=int, default=10_000)
    parser.add_argument("--lease-events", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=EVERY, help="events between checkpoints")
    parser.add_argument("--instants", type=int, default=20, help="random instants travelled to")
    parser.add_argument("--replays", type=int, default=3, help="instants also replayed in full")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--full-ratio", type=float, default=cp.FULL_RATIO, help="deltas' share of a full one"
    )
    parser.add_argument("--workdir", help="the store's directory (default: a temporary one)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    config = Config(
        args.proxies,
        args.lease_events,
        args.every,
        args.instants,
        args.replays,
        args.seed,
        args.full_ratio,
    )

    async def run() -> Report:
        if args.workdir:
            return await measure(config, Path(args.workdir))
        with tempfile.TemporaryDirectory(prefix="bench-timetravel-") as tmp:
            return await measure(config, Path(tmp))

    doc = as_json(asyncio.run(run()))
    print(json.dumps(doc["summary"], indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
