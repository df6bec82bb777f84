"""What the number of subjects in a stream costs nats-server: memory, restart, and the CPU of the
operations whose cost could grow with it (docs/architecture.md, "Scaling").

Every proxy owns ``proxy.<uid>.<category>`` subjects of the ``PROXY`` stream, so the server's
per-subject index grows with the fleet. For each size N (proxies) a fresh store's ``PROXY``
stream (the product's stream configuration) is filled with N proxies x 3 subjects (declared, cmd,
instance), one realistic event each (~160-330 bytes of JSON), written category after category
in uid order. The fill runs on a server without the product's fsync per message and without
``Nats-Msg-Id`` (3N ids in the de-duplication window would be counted as the index's memory);
the server is then stopped and every measurement runs on a server with the product's
configuration (``EmbeddedNatsServer``) restarted on the same store. Measured, in this order:

- resident memory (``VmRSS``) of an empty server, after the fill, after the clean restart,
  after the reads, after everything and after ``--idle`` seconds more without a request;
- seconds from the restart's spawn to ``/healthz`` 200 (JetStream answers), after a clean stop
  and after SIGKILL (the index rebuilt from the blocks), and the memory after the latter;
- server CPU per operation over K operations, from ``/proc/<pid>/stat`` utime+stime (10 ms
  ticks; K is chosen for seconds of CPU) and, as a check, the threads' ``schedstat``:
  ``get``, a direct get of a random proxy's literal subject (``next_by_subj``, as the store
  reads one); ``multi_last``, the direct get of ``proxy.<uid>.>``'s last messages; ``read``,
  ``JetStreamEventStore.read(subjects.proxy(uid))``; ``append``,
  ``JetStreamEventStore.append`` with ``Nats-Expected-Last-Subject-Sequence`` on
  ``proxy.<uid>.>`` (M health verdicts, 32 at a time, one per proxy at a time, over all the
  proxies or ``--append-proxies`` of them);
- delivering those M new messages to two durable pull consumers created before the appends
  (so each lags by M, more than a block's subjects): ``one``, filtered ``proxy.*.*`` (the
  stream's subject), and ``four``, filtered on the four subjects the reconciler's durable took
  before (declared, instance, health, rotate); each fetches 64 at a time and acks each, as
  ``services.runtime.nats.consumer`` does. A multi-subject filter makes the server intersect a
  block's subjects with the filters when the block holds fewer subjects than messages left in
  it, per delivery: appends over fewer proxies than a block's messages (~18,600 here) show it.

Run: ``python -m bench.subjects [--proxies 10000,100000,1000000] [--appends M] [--reads K]
[--append-proxies P] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, PubAck
from rich.console import Console

from bench.scale_fleet import FillingServer, load, memory, server_pid
from bench.scale_reads import server_cpu, settle
from bench.subjects_report import OPS, READS, Cost, Fill, SizeReport, document, render, write_json
from events import codec, subjects
from events import schemas as ev
from events.store import NewEvent, derive_msg_id
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer

STREAM = subjects.PROXY_STREAM
CATEGORIES = ("declared", "cmd", "instance")
FOUR = ("proxy.*.declared", "proxy.*.instance", "proxy.*.health", "proxy.*.rotate")
"""The reconciler durable's filters before it took the stream's one subject."""
FILTERS = {"one": ("proxy.*.*",), "four": FOUR}
"""Each read twice: first on a server that has read nothing since its restart (blocks loaded
from disk as the reads reach them), then again on other random proxies (blocks cached)."""
WINDOW = 10_000
"""Fill: acknowledgements gathered every this many publishes (nats-py keeps 4,000 in flight)."""


def uid_of(i: int) -> str:
    return f"u{i:07d}"


def event(uid: str, k: int) -> ev.Event:
    """The proxy's declared (k=0), cmd (1) and instance (2) events, as a cloud proxy's are."""
    spec = ev.ProxySpec(
        provider="aws",
        placement=ev.Placement(region="eu-west-1", machine_type="t4g.nano"),
        attributes={"pool": "crawl", "tier": "datacenter", "team": "search"},
        health_check=ev.HealthCheck(interval_seconds=30.0),
    )
    command = derive_msg_id("bench-subjects-cmd", uid)
    if k == 0:
        return ev.ProxyDeclared(uid=uid, namespace="crawl", name=f"crawler-{uid}", spec=spec)
    if k == 1:
        return ev.CreateInstance(
            command_id=command, provider="aws", instance_name=f"egress-{uid}", spec=spec
        )
    return ev.InstanceObserved(
        command_id=command,
        provider="aws",
        provider_id=f"i-0{command[:16]}",
        state=ev.InstanceState.RUNNING,
        ip="203.0.113.17",
        url="http://203.0.113.17:3128",
    )


def last_seq(proxies: int, i: int) -> int:
    """Proxy ``i``'s last sequence after the fill: its instance event, in the third round."""
    return 2 * proxies + i + 1


# --------------------------------------------------------------------------------------- fill


async def fill(conn: Connection, proxies: int) -> Fill:
    """Category after category, proxies in uid order, acknowledgements gathered every
    ``WINDOW`` publishes."""
    out = Fill(proxies)
    acks: list[asyncio.Future[PubAck]] = []
    failed = 0
    started = time.perf_counter()
    for k in range(len(CATEGORIES)):
        for i in range(proxies):
            uid = uid_of(i)
            e = event(uid, k)
            payload = codec.encode(e)
            headers = {codec.HDR_EVENT_TYPE: codec.event_type(e), codec.HDR_SCHEMA: "1"}
            subject = f"proxy.{uid}.{CATEGORIES[k]}"
            acks.append(await conn.js.publish_async(subject, payload, headers=headers))
            out.payload_bytes += len(payload)
            if len(acks) >= WINDOW:
                failed += await failures(acks)
    failed += await failures(acks)
    out.seconds = time.perf_counter() - started
    out.messages = await stored(conn)
    if failed or out.messages != proxies * len(CATEGORIES):
        raise RuntimeError(f"fill stored {out.messages} of {proxies * 3} ({failed} failed)")
    return out


async def failures(acks: list[asyncio.Future[PubAck]]) -> int:
    results = await asyncio.gather(*acks, return_exceptions=True)
    acks.clear()
    return sum(isinstance(r, BaseException) for r in results)


async def stored(conn: Connection) -> int:
    return int((await conn.js.stream_info(STREAM)).state.messages)


def store_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "jetstream").rglob("*") if p.is_file())


# ---------------------------------------------------------------------------- the operations


def ticks(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def timed(op: str, pid: int, count: int, work: Callable[[], Awaitable[int]]) -> Cost:
    """Run ``work`` (which returns how many operations did what they claim) and charge the
    server's CPU over it to ``count`` operations."""
    t0, s0, w0 = ticks(pid), server_cpu(pid), time.perf_counter()
    ok = await work()
    seconds = time.perf_counter() - w0
    t1, s1 = ticks(pid), server_cpu(pid)
    n = max(count, 1)
    return Cost(op, count, ok, seconds, 1e6 * (t1 - t0) / n, 1e6 * (s1 - s0) / n)


async def reads(store: JetStreamEventStore, op: str, uids: list[str]) -> int:
    """``get``: a literal subject's first message, as the store reads a subject; ``multi_last``:
    the last message of each of ``proxy.<uid>.>``'s subjects; ``read``: the store's read."""
    ok = 0
    for uid in uids:
        if op == "get":
            request = {"seq": 1, "next_by_subj": f"proxy.{uid}.declared", "batch": 1}
            ok += len((await store._direct_get(STREAM, request))[0]) == 1
        elif op == "multi_last":
            request = {"multi_last": [f"proxy.{uid}.>"], "batch": 1024}
            ok += len((await store._direct_get(STREAM, request))[0]) == len(CATEGORIES)
        else:
            ok += len((await store.read(subjects.proxy(uid))).events) == len(CATEGORIES)
    return ok


async def appends(
    store: JetStreamEventStore, proxies: int, m: int, seed: int, over: int = 0
) -> int:
    """``m`` health verdicts over ``over`` random proxies (0: all), in rounds over distinct ones,
    32 appends at a time, each expecting the proxy's last sequence (one writer per proxy at a
    time, as the reconciler). Fewer proxies than a block's messages repeat subjects in a block."""
    rng = random.Random(seed)
    population = rng.sample(range(proxies), over) if 0 < over < proxies else range(proxies)
    last = {i: last_seq(proxies, i) for i in population}
    gate = asyncio.Semaphore(32)
    ok = 0

    async def one(i: int, n: int) -> None:
        nonlocal ok
        uid = uid_of(i)
        verdict = ev.HealthChanged(healthy=n % 2 == 0, latency_ms=12.5, provider_id=f"i-{uid}")
        new = NewEvent(verdict, derive_msg_id("bench-subjects", uid, str(n)))
        async with gate:
            result = await store.append(subjects.proxy(uid), [new], expected_seq=last[i])
        last[i] = result.seqs[0]
        ok += result.duplicates == 0

    done = 0
    while done < m:
        batch = rng.sample(population, min(len(population), m - done))
        await asyncio.gather(*(one(i, done + j) for j, i in enumerate(batch)))
        done += len(batch)
    return ok


def consumer(name: str, start: int) -> ConsumerConfig:
    """As ``services.runtime.nats.consumer.ConsumerSpec.config`` declares a durable."""
    return ConsumerConfig(
        durable_name=f"bench-{name}",
        name=f"bench-{name}",
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=start,
        ack_wait=30.0,
        max_deliver=-1,
        max_ack_pending=128,
        filter_subjects=list(FILTERS[name]),
    )


async def consume(conn: Connection, name: str, m: int, first: int) -> int:
    """Fetch 64 at a time and ack each until ``m`` messages came; counts those delivered in
    stream order from ``first`` on (each exactly once)."""
    sub = await conn.js.pull_subscribe_bind(f"bench-{name}", STREAM)
    want, ok = first, 0
    try:
        while ok < m:
            for msg in await sub.fetch(64, timeout=10.0):
                seq = msg.metadata.sequence.stream
                ok += seq == want
                want = seq + 1
                await msg.ack()
    finally:
        await sub.unsubscribe()
    return ok


# ------------------------------------------------------------------------------------ one size


async def started(server: EmbeddedNatsServer) -> float:
    """Seconds from spawning the server to JetStream answering (``/healthz`` 200)."""
    t0 = time.perf_counter()
    await server.start(timeout=1800.0)
    return time.perf_counter() - t0


async def num_subjects(conn: Connection) -> int:
    """The stream's subject count (nats-py's ``StreamState`` leaves it out)."""
    reply = await conn.nc.request(f"$JS.API.STREAM.INFO.{STREAM}", b"", timeout=30.0)
    return int(json.loads(reply.data)["state"].get("num_subjects", 0))


async def filled(data: Path, proxies: int) -> tuple[Fill, float]:
    """The filled store, and the empty server's memory before the fill."""
    server = FillingServer(data_dir=data)
    await server.start()
    try:
        conn = await connect(server.url, name="bench-subjects-fill")
        try:
            await ensure_streams(conn.js)
            pid = server_pid(server)
            await settle(pid)
            rss_empty = memory(pid).get("VmRSS", 0.0)
            done = await fill(conn, proxies)
            await settle(pid)
            done.rss_mb = memory(pid).get("VmRSS", 0.0)
            return done, rss_empty
        finally:
            await conn.close()
    finally:
        await server.stop()


async def measure(
    proxies: int,
    *,
    m: int,
    k: int,
    over: int = 0,
    idle: float = 0.0,
    seed: int = 1,
    console: Console | None = None,
) -> SizeReport:
    """One size on a fresh store: fill (relaxed server), then the product's server on it."""
    with tempfile.TemporaryDirectory(prefix="bench-subjects-") as tmp:
        data = Path(tmp)
        done, rss_empty = await filled(data, proxies)
        report = SizeReport(proxies, done, rss_empty_mb=rss_empty, load1=round(load()[0], 2))
        report.store_mb = round(store_bytes(data) / 2**20, 1)
        report.append_proxies = min(over, proxies) if over else proxies
        if console:
            console.print(f"{proxies:,} proxies: {done.messages:,} stored in {done.seconds:,.0f} s")
        server = EmbeddedNatsServer(data_dir=data)
        try:
            report.ready_s = await started(server)
            pid = server_pid(server)
            await settle(pid)
            report.rss_restart_mb = memory(pid).get("VmRSS", 0.0)
            conn = await connect(server.url, name="bench-subjects")
            try:
                report.subjects = await num_subjects(conn)
                await operations(report, conn, pid, m=m, k=k, over=over, seed=seed)
                report.stored_after = await stored(conn)
                await settle(pid)
                report.rss_after_ops_mb = memory(pid).get("VmRSS", 0.0)
                await asyncio.sleep(idle)
                report.rss_idle_mb = memory(pid).get("VmRSS", 0.0)
            finally:
                await conn.close()
            await server.kill()
            report.ready_after_kill_s = await started(server)
            pid = server_pid(server)
            await settle(pid)
            report.rss_crash_mb = memory(pid).get("VmRSS", 0.0)
            check = await connect(server.url, name="bench-subjects-check")
            try:
                if await stored(check) != report.stored_after:
                    raise RuntimeError("the stream lost messages across the SIGKILL")
            finally:
                await check.close()
        finally:
            await server.stop()
        return report


async def operations(
    report: SizeReport, conn: Connection, pid: int, *, m: int, k: int, over: int, seed: int
) -> None:
    """The reads on K random proxies each, then the durables, the M appends, the deliveries."""
    rng = random.Random(seed)
    store = JetStreamEventStore(conn.nc, conn.js)
    proxies, costs = report.proxies, report.costs
    for name in OPS[: 2 * len(READS)]:
        op = name.removesuffix(" again")
        uids = [uid_of(rng.randrange(proxies)) for _ in range(k)]
        costs.append(await timed(name, pid, k, partial(reads, store, op, uids)))
        await settle(pid)
    report.rss_after_reads_mb = memory(pid).get("VmRSS", 0.0)
    first = len(CATEGORIES) * proxies + 1
    for name in FILTERS:
        await conn.js.add_consumer(STREAM, consumer(name, first))
    costs.append(await timed("append", pid, m, partial(appends, store, proxies, m, seed, over)))
    await settle(pid)
    for name in FILTERS:
        costs.append(await timed(name, pid, m, partial(consume, conn, name, m, first)))
        await settle(pid)


def proxy_counts(text: str) -> list[int]:
    try:
        values = [int(v.replace("_", "")) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--proxies: comma-separated integers ({exc})") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("--proxies: each size is at least 1 proxy")
    return values


async def run(args: argparse.Namespace, console: Console) -> list[SizeReport]:
    reports: list[SizeReport] = []
    for proxies in args.proxies:
        reports.append(
            await measure(
                proxies,
                m=args.appends,
                k=args.reads,
                over=args.append_proxies,
                idle=args.idle,
                seed=args.seed,
                console=console,
            )
        )
        render(reports[-1:], console)
        if args.json:  # after each size: a later one may take the machine's whole memory
            await asyncio.to_thread(write_json, Path(args.json), document(reports))
    return reports


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.subjects", description=__doc__)
    parser.add_argument("--proxies", type=proxy_counts, default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--appends", type=int, default=40_000, help="M appends/deliveries")
    parser.add_argument("--reads", type=int, default=20_000, help="K reads of each kind")
    parser.add_argument(
        "--append-proxies", type=int, default=0, help="spread the appends over this many (0: all)"
    )
    parser.add_argument(
        "--idle", type=float, default=60.0, help="seconds idle before the last RSS sample"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.appends < 1 or args.reads < 1 or args.append_proxies < 0:
        parser.error("--appends and --reads: at least 1 each; --append-proxies: 0 (all) or more")
    console = Console(width=max(160, Console().width))
    reports = asyncio.run(run(args, console))
    render(reports, console)


if __name__ == "__main__":
    main()
