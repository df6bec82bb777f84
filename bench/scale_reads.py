"""Aggregate reads at fleet scale: does reading one proxy cost the same in a stream of 10^4
messages and of 10^6?

Every decide-and-append reads its aggregate first (docs/architecture.md, "Reads"), so if that read
grows with the whole stream, a fleet's total cost grows with the square of its size. For each
size the benchmark fills a fresh store's ``PROXY`` stream (the product's stream configuration)
with ``size / 6`` proxies of 6 events each, spread over the 5 categories and written round by
round (every proxy's first event, then every proxy's second, ...), so one proxy's events lie far
apart in the stream, as a fleet's do. The fill runs on a server without the product's fsync after
every message (a million fsyncs would take most of an hour); the reads are timed on a server with
the product's configuration, restarted on the same store. Readers, each on the same random
proxies within a round, alternating which goes first each round:

- ``wildcard``: the read as it was before, batched direct gets with ``next_by_subj`` set to
  ``proxy.<uid>.>`` from the start (``--slow-reads`` of them: it is the slow one);
- ``store``: ``JetStreamEventStore.read`` as it is now;
- ``subjects``: the store's reads of each literal subject without its ``multi_last`` snapshot,
  to show what the snapshot costs.

Every read must return the proxy's 6 events; one that does not is counted as wrong. Server CPU
per read is the nats-server process's own CPU time over the reads (Linux ``/proc``), so it
excludes this client and the machine's other work, but includes whatever the server does in the
background meanwhile (measured while idle before the reads, and reported).

Run: ``python -m bench.scale_reads [--sizes 10000,1000000] [--reads N] [--rounds R] [--json F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nats.aio.msg import Msg
from nats.js.api import PubAck
from rich.console import Console
from rich.table import Table

from events import codec, subjects
from events import schemas as ev
from events.store import History
from events.subjects import Aggregate
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.credentials import write_private
from services.runtime.nats.server import PID_FILE, EmbeddedNatsServer

EVENTS_PER_PROXY = 6
GROWTH_TARGET = 1.5
"""Largest size's per-read cost over the smallest's: at most this much (the issue's target)."""

Reader = Callable[[JetStreamEventStore, Aggregate], Awaitable[History]]


# ------------------------------------------------------------------------------------ the data


def proxy_event(uid: str, k: int) -> ev.Event:
    """A proxy's ``k``-th event: declared, cmd, instance, health, status, then health again, so
    every category holds one event and one holds two."""
    pid = f"i-{uid}"
    if k == 0:
        spec = ev.ProxySpec(provider="bench", attributes={"pool": "crawl"})
        return ev.ProxyDeclared(uid=uid, namespace="bench", name=uid, spec=spec)
    if k == 1:
        spec = ev.ProxySpec(provider="bench")
        return ev.CreateInstance(command_id="c1", provider="bench", instance_name=uid, spec=spec)
    if k == 2:  # the events in order
        return ev.InstanceCreated(command_id="c1", provider="bench", provider_id=pid)
    if k == 4:
        return ev.PhaseChanged(phase=ev.Phase.READY, ip="10.0.0.1", provider_id=pid)
    return ev.HealthChanged(healthy=k == 3, latency_ms=12.5, provider_id=pid)


def uid_of(i: int) -> str:
    return f"p{i:07d}"


@dataclass(frozen=True, slots=True)
class Fill:
    messages: int
    proxies: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


async def stored(conn: Connection) -> int:
    info = await conn.js.stream_info(subjects.PROXY_STREAM)
    return int(info.state.messages)


async def fill(conn: Connection, size: int, *, seed: int = 1) -> Fill:
    """``size // 6`` proxies, written round by round in a new random order each round, without
    waiting for each acknowledgement (nats-py keeps at most 4,000 in flight). No ``Nats-Msg-Id``:
    de-duplication plays no part in a read, and a million ids would only fill the server's memory.
    """
    proxies = size // EVENTS_PER_PROXY
    rng = random.Random(seed)
    before = await stored(conn)
    started = time.perf_counter()
    failed = 0
    acks: list[asyncio.Future[PubAck]] = []
    for k in range(EVENTS_PER_PROXY):
        order = list(range(proxies))
        rng.shuffle(order)
        for i in order:
            uid = uid_of(i)
            event = proxy_event(uid, k)
            headers = {codec.HDR_EVENT_TYPE: codec.event_type(event), codec.HDR_SCHEMA: "1"}
            subject = subjects.proxy(uid).subject_for(event)
            acks.append(await conn.js.publish_async(subject, codec.encode(event), headers=headers))
            if len(acks) >= 10_000:
                failed += await _failures(acks)
    failed += await _failures(acks)
    seconds = time.perf_counter() - started
    total = await stored(conn) - before
    if failed or total != proxies * EVENTS_PER_PROXY:
        raise RuntimeError(f"fill stored {total} of {proxies * EVENTS_PER_PROXY} ({failed} failed)")
    return Fill(total, proxies, seconds)


async def _failures(acks: list[asyncio.Future[PubAck]]) -> int:
    results = await asyncio.gather(*acks, return_exceptions=True)
    acks.clear()
    return sum(isinstance(r, BaseException) for r in results)


# ----------------------------------------------------------------------------------- the reads


async def wildcard_read(store: JetStreamEventStore, aggregate: Aggregate) -> History:
    """The read as it was before: batched direct gets with the aggregate's wildcard filter from
    the start, page after page, then the store's own decoding."""
    out: list[Msg] = []
    start = 1
    while True:
        request = {"seq": start, "next_by_subj": aggregate.filter_subject, "batch": 1000}
        got, pending = await store._direct_get(aggregate.stream, request)
        out.extend(got)
        if not got or pending == 0:
            break
        start = int((got[-1].headers or {})["Nats-Sequence"]) + 1
    return store._history(aggregate, out, after_seq=0)


async def store_read(store: JetStreamEventStore, aggregate: Aggregate) -> History:
    return await store.read(aggregate)


async def subjects_read(store: JetStreamEventStore, aggregate: Aggregate) -> History:
    """Each literal subject read at once and merged, without the ``multi_last`` snapshot the
    store adds: what the snapshot costs. Not a consistent read under concurrent appends."""
    pages = await asyncio.gather(
        *(
            store._read_subject(aggregate.stream, subject, after_seq=0)
            for subject in aggregate.literal_subjects
        )
    )
    merged = sorted((m for page in pages for m in page), key=_seq)
    return store._history(aggregate, merged, after_seq=0)


def _seq(msg: Msg) -> int:
    return int((msg.headers or {})["Nats-Sequence"])


READERS: dict[str, Reader] = {
    "wildcard": wildcard_read,
    "store": store_read,
    "subjects": subjects_read,
}
SLOW = frozenset({"wildcard"})
"""Readers that get ``--slow-reads`` reads: at a million messages one wildcard read takes a
tenth of a second."""


# ----------------------------------------------------------------------------- the server's CPU


def server_cpu(pid: int) -> float:
    """CPU seconds of a process so far: the sum over its threads of ``schedstat`` (nanoseconds),
    else user + system ticks from ``stat``; 0 where there is no ``/proc``."""
    try:
        tasks = Path(f"/proc/{pid}/task")
        return sum(int((t / "schedstat").read_text().split()[0]) for t in tasks.iterdir()) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def settle(
    pid: int, *, quiet: float = 0.02, window: float = 0.5, limit: float = 60.0
) -> float:
    """Wait until the server uses less than ``quiet`` of a core (flushing a fill can take a
    while); return its idle CPU share over the last window."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while True:
        before = server_cpu(pid)
        await asyncio.sleep(window)
        share = (server_cpu(pid) - before) / window
        if share < quiet or loop.time() > deadline:
            return share


# ----------------------------------------------------------------------------------- measuring


@dataclass(frozen=True, slots=True)
class Timed:
    reader: str
    reads: int
    wrong: int
    """Reads that did not return the proxy's 6 events."""
    p50_us: float
    p99_us: float
    mean_us: float
    server_cpu_us: float
    client_cpu_us: float


@dataclass
class SizeReport:
    size: int
    fill: Fill
    idle_server_share: float = 0.0
    rounds: list[list[Timed]] = field(default_factory=list)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per reader, the median over rounds of each figure, and reads that went wrong."""
        out: dict[str, dict[str, float]] = {}
        for name in READERS:
            runs = [t for r in self.rounds for t in r if t.reader == name]
            if not runs:
                continue
            out[name] = {
                figure: statistics.median(getattr(t, figure) for t in runs)
                for figure in ("p50_us", "p99_us", "mean_us", "server_cpu_us", "client_cpu_us")
            }
            out[name]["wrong"] = sum(t.wrong for t in runs)
            out[name]["reads"] = sum(t.reads for t in runs)
        return out


async def time_reads(store: JetStreamEventStore, pid: int, name: str, uids: list[str]) -> Timed:
    reader = READERS[name]
    latencies: list[float] = []
    wrong = 0
    cpu0, client0 = server_cpu(pid), time.process_time()
    for uid in uids:
        started = time.perf_counter()
        history = await reader(store, subjects.proxy(uid))
        latencies.append(time.perf_counter() - started)
        wrong += len(history.events) != EVENTS_PER_PROXY
    server, client = server_cpu(pid) - cpu0, time.process_time() - client0
    latencies.sort()
    n = len(uids)
    return Timed(
        reader=name,
        reads=n,
        wrong=wrong,
        p50_us=1e6 * statistics.median(latencies),
        p99_us=1e6 * latencies[min(n - 1, int(0.99 * n))],
        mean_us=1e6 * sum(latencies) / n,
        server_cpu_us=1e6 * server / n,
        client_cpu_us=1e6 * client / n,
    )


class FillingServer(EmbeddedNatsServer):
    """The product's server without its fsync after every message, only to fill the stream."""

    def write_config(self) -> Path:
        conf = super().write_config()
        write_private(conf, conf.read_text().replace("sync_interval: always", ""))
        return conf


async def filled_store(data_dir: Path, size: int, seed: int) -> Fill:
    server = FillingServer(data_dir=data_dir)
    await server.start()
    try:
        conn = await connect(server.url, name="bench-scale-reads-fill")
        try:
            await ensure_streams(conn.js)
            return await fill(conn, size, seed=seed)
        finally:
            await conn.close()
    finally:
        await server.stop()


@dataclass
class Target:
    """One filled store, served with the product's configuration while it is measured."""

    report: SizeReport
    store: JetStreamEventStore
    pid: int
    rng: random.Random


async def measure(
    sizes: list[int],
    *,
    reads: int,
    rounds: int,
    slow_reads: int = 200,
    seed: int = 1,
    console: Console | None = None,
) -> list[SizeReport]:
    """Fill a fresh store per size, serve them all, then ``rounds`` rounds: in each, every size
    in turn (alternating which goes first), ``reads`` random proxies read by every reader
    (alternating which goes first). All sizes meet the same load in a round, so the ratio
    between sizes can be taken within each round."""
    async with contextlib.AsyncExitStack() as stack:
        targets: list[Target] = []
        for size in sizes:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-scale-")))
            filled = await filled_store(tmp, size, seed)
            if console:
                console.print(
                    f"{size:,}: filled {filled.messages:,} messages in {filled.seconds:,.1f} s "
                    f"({filled.rate:,.0f}/s)"
                )
            server = EmbeddedNatsServer(data_dir=tmp)
            await server.start()
            stack.push_async_callback(server.stop)
            conn = await connect(server.url, name="bench-scale-reads")
            stack.push_async_callback(conn.close)
            await ensure_streams(conn.js)
            if await stored(conn) != filled.messages:
                raise RuntimeError("the stream lost messages across the restart")
            pid = int((tmp / PID_FILE).read_text().strip())
            store = JetStreamEventStore(conn.nc, conn.js)
            targets.append(Target(SizeReport(size, filled), store, pid, random.Random(seed)))
        for target in targets:
            target.report.idle_server_share = await settle(target.pid)
        names = list(READERS)
        for r in range(rounds):
            for target in targets if r % 2 == 0 else targets[::-1]:
                proxies = target.report.fill.proxies
                uids = [uid_of(target.rng.randrange(proxies)) for _ in range(reads)]
                order = names if r % 2 == 0 else names[::-1]
                timed = [
                    await time_reads(
                        target.store, target.pid, n, uids[:slow_reads] if n in SLOW else uids
                    )
                    for n in order
                ]
                target.report.rounds.append(timed)
        return [target.report for target in targets]


# ----------------------------------------------------------------------------------- reporting


def growth(reports: list[SizeReport]) -> dict[str, dict[str, Spread]]:
    """Per reader: the largest size's p50 and server CPU per read over the smallest's, taken
    within each round (under one load), as median, min and max over the rounds."""
    if len(reports) < 2:
        return {}
    small, large = reports[0], reports[-1]
    out: dict[str, dict[str, Spread]] = {}
    for name in READERS:
        pairs = [
            (a, b)
            for ra, rb in zip(small.rounds, large.rounds, strict=False)
            for a in ra
            for b in rb
            if a.reader == b.reader == name
        ]
        if pairs:
            out[name] = {
                figure: spread(
                    [
                        getattr(b, figure) / getattr(a, figure)
                        for a, b in pairs
                        if getattr(a, figure)
                    ]
                    or [0.0]
                )
                for figure in ("p50_us", "server_cpu_us")
            }
    return out


Spread = tuple[float, float, float]


def spread(values: list[float]) -> Spread:
    return statistics.median(values), min(values), max(values)


def render(reports: list[SizeReport], console: Console) -> dict[str, dict[str, Spread]]:
    table = Table(title="aggregate reads: medians over rounds, per read")
    columns = ("messages", "reader", "reads", "p50 µs", "p99 µs", "server CPU µs", "client CPU µs")
    for column in (*columns, "wrong"):
        table.add_column(column, justify="left" if column == "reader" else "right")
    for report in reports:
        for name, figures in report.summary().items():
            table.add_row(
                f"{report.size:,}",
                name,
                f"{figures['reads']:,.0f}",
                f"{figures['p50_us']:,.0f}",
                f"{figures['p99_us']:,.0f}",
                f"{figures['server_cpu_us']:,.0f}",
                f"{figures['client_cpu_us']:,.0f}",
                f"{figures['wrong']:.0f}",
            )
        table.rows[-1].end_section = True
    console.print(table)
    ratios = growth(reports)
    if ratios:
        first, last = reports[0].size, reports[-1].size
        console.print(f"growth, {last:,} over {first:,} messages, median (min-max) over rounds:")
        for name, ratio in ratios.items():
            met = "met" if max(v[0] for v in ratio.values()) <= GROWTH_TARGET else "NOT met"
            p50, cpu = ratio["p50_us"], ratio["server_cpu_us"]
            console.print(
                f"  {name}: p50 x{p50[0]:.2f} ({p50[1]:.2f}-{p50[2]:.2f}), server CPU "
                f"x{cpu[0]:.2f} ({cpu[1]:.2f}-{cpu[2]:.2f}); target <= {GROWTH_TARGET}: {met}"
            )
    for report in reports:
        console.print(
            f"{report.size:,}: fill {report.fill.seconds:,.1f} s, server idle before the reads "
            f"{100 * report.idle_server_share:.1f}% of a core"
        )
    return ratios


async def _main(args: argparse.Namespace) -> dict[str, object]:
    console = Console(width=max(120, Console().width))
    reports = await measure(
        args.sizes,
        reads=args.reads,
        rounds=args.rounds,
        slow_reads=args.slow_reads,
        seed=args.seed,
        console=console,
    )
    ratios = render(reports, console)
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        },
        "sizes": [
            {"size": r.size, "fill": asdict(r.fill), "idle_server_share": r.idle_server_share}
            | {"summary": r.summary(), "rounds": [[asdict(t) for t in rnd] for rnd in r.rounds]}
            for r in reports
        ],
        "growth": ratios,
        "target": GROWTH_TARGET,
    }


def sizes(text: str) -> list[int]:
    values = [int(v.replace("_", "")) for v in text.split(",") if v.strip()]
    if not values or any(v < EVENTS_PER_PROXY for v in values):
        raise argparse.ArgumentTypeError(f"sizes are messages, each at least {EVENTS_PER_PROXY}")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_reads", description=__doc__)
    parser.add_argument(
        "--sizes", type=sizes, default=[10_000, 1_000_000], help="stream sizes in messages"
    )
    parser.add_argument("--reads", type=int, default=2_000, help="reads per reader and round")
    parser.add_argument(
        "--slow-reads", type=int, default=200, help="reads per round of the wildcard reader"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds, alternating the order")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fill and the samples")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    doc = asyncio.run(_main(args))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
