"""Event-log throughput against the client library it wraps, on one nats-server.

The targets (append >= 0.8x raw publish, rebuild >= 0.7x raw fetch+decode) bound what the store
and the projector runtime may cost on top of nats-py, so both sides get the same server, stream
config, payloads and concurrency; only the layer under test differs. Raw and ours alternate which
goes first each round, because on a shared machine the load drifts within a run. Client CPU per
event is reported too: unlike events/s it barely moves with the machine's load, so it shows where a
gap comes from when throughput alone is too noisy to say.

Run: ``python -m bench.eventlog [--events N] [--concurrency C] [--rounds R] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from rich.console import Console
from rich.table import Table

from events import codec, subjects
from events import schemas as ev
from events.errors import ConcurrencyError
from events.store import NewEvent, derive_msg_id
from projections import proxy as proxy_view
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.projector import Projector
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer

FILTER = "proxy.*.*"
TARGETS = {"append": 0.8, "rebuild": 0.7}


@dataclass(frozen=True, slots=True)
class Planned:
    subject: str
    new: NewEvent
    payload: bytes
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Run:
    events: int
    seconds: float
    cpu_seconds: float
    conflicts: int = 0
    duplicates: int = 0
    views: int = 0

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us(self) -> float:
        return 1e6 * self.cpu_seconds / self.events if self.events else 0.0


@dataclass
class Report:
    events: int
    concurrency: int
    uids: int
    rounds: int
    stored: int = 0
    append: list[tuple[Run, Run]] = field(default_factory=list)
    rebuild: list[tuple[Run, Run]] = field(default_factory=list)


def _clock() -> Callable[[], tuple[float, float]]:
    """Wall and process CPU time together; the CPU is this client's alone, not the server's."""
    wall, cpu = time.perf_counter(), time.process_time()
    return lambda: (time.perf_counter() - wall, time.process_time() - cpu)


def _event(uid: str, k: int) -> ev.Event:
    """A realistic mix: a declaration first, then what the executor and health checker report."""
    if k == 0:
        placement = ev.Placement(region="eu-west-1", zone="eu-west-1a", machine_type="t3.micro")
        spec = ev.ProxySpec(provider="bench", placement=placement, attributes={"pool": "crawl"})
        return ev.ProxyDeclared(uid=uid, namespace="bench", name=uid, spec=spec)
    pid = f"i-{uid}"
    if k % 3 == 1:
        return ev.InstanceObserved(
            command_id=f"c{k}", provider="bench", provider_id=pid, state=ev.InstanceState.RUNNING
        )
    if k % 3 == 2:
        return ev.HealthChanged(healthy=k % 2 == 0, latency_ms=12.5, provider_id=pid)
    return ev.PhaseChanged(phase=ev.Phase.READY, ip="10.0.0.1", provider_id=pid)


def plan(prefix: str, events: int, uids: int) -> dict[str, list[Planned]]:
    """Every event of a run, built and encoded up front so neither side is timed doing it."""
    out: dict[str, list[Planned]] = {f"{prefix}-{i}": [] for i in range(uids)}
    names = list(out)
    for n in range(events):
        uid = names[n % uids]
        event = _event(uid, len(out[uid]))
        new = NewEvent(event, derive_msg_id("bench", uid, str(len(out[uid]))))
        headers = codec.envelope_headers(event, new.msg_id)
        subject = subjects.proxy(uid).subject_for(event)
        out[uid].append(Planned(subject, new, codec.encode(event), headers))
    return out


async def _workers(
    planned: dict[str, list[Planned]],
    concurrency: int,
    work: Callable[[str, Planned], Awaitable[None]],
) -> tuple[float, float]:
    """Each worker owns a fixed set of aggregates, so no two writers ever race on one."""

    async def worker(uids: list[str]) -> None:
        for k in range(max(len(planned[u]) for u in uids)):
            for uid in uids:
                if k < len(planned[uid]):
                    await work(uid, planned[uid][k])

    owned = [part for w in range(concurrency) if (part := list(planned)[w::concurrency])]
    clock = _clock()
    await asyncio.gather(*(worker(uids) for uids in owned))
    return clock()


async def append_raw(js: JetStreamContext, prefix: str, events: int, uids: int, c: int) -> Run:
    planned = plan(prefix, events, uids)
    duplicates = 0

    async def work(_: str, p: Planned) -> None:
        nonlocal duplicates
        ack = await js.publish(p.subject, p.payload, headers=p.headers)
        duplicates += bool(ack.duplicate)

    return Run(events, *await _workers(planned, c, work), duplicates=duplicates)


async def append_ours(
    store: JetStreamEventStore, prefix: str, events: int, uids: int, c: int
) -> Run:
    """Appends with the optimistic-concurrency check, as every service does
    (docs/architecture.md, The event log)."""
    planned = plan(prefix, events, uids)
    last = dict.fromkeys(planned, 0)
    conflicts = duplicates = 0

    async def work(uid: str, p: Planned) -> None:
        nonlocal conflicts, duplicates
        aggregate = subjects.proxy(uid)
        while True:
            try:
                result = await store.append(aggregate, [p.new], expected_seq=last[uid])
            except ConcurrencyError:
                conflicts += 1
                last[uid] = (await store.read(aggregate)).last_seq
                continue
            last[uid] = result.last_seq
            duplicates += result.duplicates
            return

    seconds, cpu = await _workers(planned, c, work)
    return Run(events, seconds, cpu, conflicts=conflicts, duplicates=duplicates)


async def rebuild_raw(js: JetStreamContext, filter_subject: str, expected: int) -> Run:
    """The floor a projection rebuild is held to: fetch and decode, nothing folded."""
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,
        deliver_policy=DeliverPolicy.ALL,
        filter_subject=filter_subject,
        inactive_threshold=300.0,
        mem_storage=True,
        num_replicas=1,
    )
    clock = _clock()
    sub = await js.pull_subscribe(
        filter_subject, durable=None, stream=subjects.PROXY_STREAM, config=config
    )
    got = 0
    while got < expected:
        for msg in await sub.fetch(1000, timeout=5.0):
            codec.decode(msg.data, msg.headers)
            got += 1
    seconds, cpu = clock()
    await sub.unsubscribe()
    return Run(got, seconds, cpu)


async def rebuild_ours(js: JetStreamContext, filter_subject: str) -> Run:
    clock = _clock()
    projector = Projector(js, subjects.PROXY_STREAM, filter_subject, proxy_view.apply)
    await projector.catch_up()
    seconds, cpu = clock()
    await projector.close()
    return Run(projector.applied, seconds, cpu, views=len(projector.views))


async def measure(
    conn: Connection, *, events: int, concurrency: int, uids: int, rounds: int
) -> Report:
    """Appends first (fresh aggregates each round), then cold rebuilds of all they wrote.

    Which side goes first alternates by round, so neither always runs on the fresher machine.
    """
    store = JetStreamEventStore(conn.nc, conn.js)
    report = Report(events, concurrency, uids, rounds)
    for r in range(rounds):
        args = (events, uids, concurrency)
        raw = partial(append_raw, conn.js, f"raw-r{r}", *args)
        report.append.append(
            await _in_turn(r, raw, partial(append_ours, store, f"ours-r{r}", *args))
        )
    report.stored = (await conn.js.stream_info(subjects.PROXY_STREAM)).state.messages
    for r in range(rounds):
        raw = partial(rebuild_raw, conn.js, FILTER, report.stored)
        report.rebuild.append(await _in_turn(r, raw, partial(rebuild_ours, conn.js, FILTER)))
    return report


async def _in_turn(
    r: int, raw: Callable[[], Awaitable[Run]], ours: Callable[[], Awaitable[Run]]
) -> tuple[Run, Run]:
    if r % 2:
        mine = await ours()
        return await raw(), mine
    theirs = await raw()
    return theirs, await ours()


Spread = tuple[float, float, float]


def spread(values: list[float]) -> Spread:
    return statistics.median(values), min(values), max(values)


def summary(pairs: list[tuple[Run, Run]]) -> dict[str, Spread]:
    """Median, min and max per figure; the ratio is taken within a round, under one load."""
    return {
        "raw_rate": spread([r.rate for r, _ in pairs]),
        "ours_rate": spread([o.rate for _, o in pairs]),
        "ratio": spread([o.rate / r.rate if r.rate else 0.0 for r, o in pairs]),
        "raw_cpu_us": spread([r.cpu_us for r, _ in pairs]),
        "ours_cpu_us": spread([o.cpu_us for _, o in pairs]),
    }


def render(report: Report, console: Console) -> dict[str, dict[str, Spread]]:
    """Rates only from runs that read every event: a rebuild that stopped early is not fast."""
    wanted = {"append": report.events, "rebuild": report.stored}
    complete = {
        name: [p for p in getattr(report, name) if p[0].events == p[1].events == wanted[name]]
        for name in TARGETS
    }
    rows = {name: summary(pairs) for name, pairs in complete.items() if pairs}
    table = Table(title=f"event log, {report.rounds} rounds")
    for column in ("", "median", "min", "max", "CPU µs/ev | target"):
        table.add_column(column, justify="right" if column else "left")
    for name, row in rows.items():
        for side in ("raw", "ours"):
            figures = (f"{v:,.0f}" for v in row[f"{side}_rate"])
            table.add_row(f"{name} {side} ev/s", *figures, f"{row[f'{side}_cpu_us'][0]:.0f}")
        met = "met" if row["ratio"][0] >= TARGETS[name] else "NOT met"
        ratios = (f"{v:.2f}" for v in row["ratio"])
        table.add_row("ours/raw", *ratios, f">= {TARGETS[name]} {met}", end_section=True)
    console.print(table)
    conflicts = sum(o.conflicts for _, o in report.append)
    dups = sum(r.duplicates + o.duplicates for r, o in report.append)
    console.print(f"append: {conflicts} conflicts, {dups} duplicates")
    for name in TARGETS:
        short = [
            (r.events, o.events) for r, o in getattr(report, name) if (r, o) not in complete[name]
        ]
        if short:
            console.print(f"{name}: INCOMPLETE (raw, ours) reads of {wanted[name]}: {short}")
    return rows


async def _main(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench-eventlog-") as tmp:
        server = EmbeddedNatsServer(data_dir=Path(tmp))
        await server.start()
        conn = await connect(server.url, name="bench")
        try:
            await ensure_streams(conn.js)
            sizes = {"events": args.events, "concurrency": args.concurrency, "uids": args.uids}
            report = await measure(conn, **sizes, rounds=args.rounds)
            version = conn.nc.connected_server_version
        finally:
            await conn.close()
            await server.stop()
    doc: dict[str, object] = {k: v for k, v in asdict(report).items() if k not in TARGETS}
    doc["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    doc |= {"nats_server": str(version), "targets": TARGETS, "summary": render(report, Console())}
    return doc | {k: [[asdict(r), asdict(o)] for r, o in getattr(report, k)] for k in TARGETS}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.eventlog", description=__doc__)
    parser.add_argument("--events", type=int, default=20_000, help="events per append run")
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent writers")
    parser.add_argument("--uids", type=int, default=1_000, help="proxy aggregates per run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved raw/ours rounds")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    doc = asyncio.run(_main(args))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
