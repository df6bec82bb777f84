"""The nats-server and discovery with a fleet of Ready proxies: the server's memory and store, a
kill -9 of the server and its restart on the same store, discovery's catch-up before and after
it, and what an acquire+release cycle costs the API with that fleet in its views.

Each size gets its own store, filled as ``bench.scale_fleet`` fills one (the events the system
writes for a proxy from its declaration to Ready and healthy, seven a proxy, without the fsync
per message), and then served with the product's configuration. The sizes run one after the
other in one invocation, so the small fleet is the baseline of the large one on the same machine
minutes apart (the issue's "a lease cycle's cost at 10^5 against a small fleet").

For each size, in this order:

1. *server*: a clean start on the filled store (process creation to JetStream's ``/healthz``
   200, and its CPU), then, once idle, its ``VmRSS``/``VmHWM``, the bytes every stream holds
   (``stream_info``, key-value buckets included) and the store's blocks on disk;
2. *discovery*: ``egress-proxies run discovery`` from process creation to ``/healthz`` 200 (it
   serves only once its views have caught up), then, once idle (its checkpoint writer folds the
   fleet once in the background), its RSS and CPU, and the server's RSS again;
3. *leases*: ``bench.discovery``'s acquire+release cycle from ``--clients`` keep-alive
   connections, back to back, ``--lease-rounds`` times ``--lease-seconds``: the API's and the
   server's CPU per cycle (``/proc``, barely moved by the machine's load), cycles/s and p50;
4. *restart*: SIGKILL to the server (no clean shutdown: it must rebuild what it had in memory
   from its blocks), a new server on the same store and port at once: seconds and CPU until
   JetStream answers, its CPU until idle and its RSS then; and from the new process's creation
   until discovery (the same process, which only reconnects) answers ``/healthz`` 200 again and
   until its first acquire+release cycle succeeds, with discovery's CPU over that time.

Run: ``python -m bench.scale_server [--sizes 1000,100000] [--lease-seconds 8] [--json FILE]``.
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
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.discovery import drive, http_cycle
from bench.discovery_report import Load, pct
from bench.discovery_worker import HttpConnection
from bench.scale_fleet import (
    Child,
    Filled,
    History,
    cpu_seconds,
    fill_store,
    http_get,
    idle,
    load1,
    memory,
    proxy_uid,
    publish_fleet,
    ready_history,
    running,
    service_argv,
    until_healthz,
)
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.logs import configure_logging
from services.runtime.ports import free_port

START_TIMEOUT = 900.0
"""A server's start on a large store, or after a SIGKILL, may take minutes: that is measured."""


@dataclass(frozen=True, slots=True)
class Process:
    """One reading of a process: resident memory now and at its peak, CPU so far."""

    rss_mb: float
    peak_mb: float
    cpu_s: float

    @classmethod
    def of(cls, pid: int) -> Process:
        mem = memory(pid)
        return cls(mem.get("VmRSS", 0.0), mem.get("VmHWM", 0.0), round(cpu_seconds(pid), 2))


@dataclass(frozen=True, slots=True)
class Cycles:
    """One round of lease cycles: ``bench.discovery``'s ``leases`` phase."""

    seconds: float
    cycles: int
    errors: dict[str, int]
    api_us: float
    """The API process's CPU per acquire+release cycle."""
    server_us: float
    p50_ms: float

    @classmethod
    def of(cls, load: Load) -> Cycles:
        return cls(
            seconds=round(load.seconds, 2),
            cycles=load.cycles,
            errors=dict(load.errors),
            api_us=round(load.cpu_us("api", "cycle"), 1),
            server_us=round(load.cpu_us("nats-server", "cycle"), 1),
            p50_ms=round(pct(load.latency_ms, 50), 2),
        )


@dataclass(frozen=True, slots=True)
class Restart:
    jetstream_s: float
    """The new server's process creation to JetStream's ``/healthz`` 200 (streams recovered)."""
    jetstream_cpu_s: float
    idle_cpu_s: float
    """The new server's CPU from its creation until it was idle."""
    before: Process
    """The killed server, just before the kill."""
    after: Process
    """The new server once idle."""
    discovery_healthz_s: float
    """The new server's creation to discovery's ``/healthz`` 200 again."""
    discovery_cycle_s: float
    """The new server's creation to discovery's first acquire+release cycle that succeeded."""
    discovery_cpu_s: float
    """Discovery's CPU from the kill until that cycle."""
    failed_cycles: int
    """Cycles tried before that one (each waits for its answer, errors included)."""


@dataclass
class Size:
    proxies: int
    fill: Filled
    start_s: float = 0.0
    start_cpu_s: float = 0.0
    server: Process | None = None
    streams: dict[str, dict[str, int]] = field(default_factory=dict)
    """Stream (key-value buckets included) -> its messages and bytes."""
    disk_bytes: int = 0
    """The blocks the server's store directory takes on disk."""
    discovery_caught_up_s: float = 0.0
    discovery: Process | None = None
    server_with_discovery: Process | None = None
    cycles: list[Cycles] = field(default_factory=list)
    restart: Restart | None = None
    loads: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        cycled = [c for c in self.cycles if c.cycles]
        server = self.server or Process(0.0, 0.0, 0.0)
        stored = sum(s["bytes"] for s in self.streams.values())
        return {
            "proxies": self.proxies,
            "events": self.fill.events,
            "server_start_s": round(self.start_s, 2),
            "server_start_cpu_s": round(self.start_cpu_s, 2),
            "server_rss_mb": server.rss_mb,
            "server_rss_kb_per_proxy": round(server.rss_mb * 1024 / max(1, self.proxies), 2),
            "server_with_discovery_rss_mb": (self.server_with_discovery or server).rss_mb,
            "stream_bytes": stored,
            "disk_bytes": self.disk_bytes,
            "discovery_caught_up_s": round(self.discovery_caught_up_s, 2),
            "discovery_rss_mb": self.discovery.rss_mb if self.discovery else 0.0,
            "discovery_cpu_s": self.discovery.cpu_s if self.discovery else 0.0,
            "cycle_api_us": round(statistics.median(c.api_us for c in cycled), 1) if cycled else 0,
            "cycle_server_us": round(statistics.median(c.server_us for c in cycled), 1)
            if cycled
            else 0,
            "cycles_per_s": round(statistics.median(c.cycles / c.seconds for c in cycled), 1)
            if cycled
            else 0,
            "cycle_errors": sum(sum(c.errors.values()) for c in self.cycles),
            "restart": asdict(self.restart) if self.restart else None,
            "load": self.loads,
        }


def disk_bytes(path: Path) -> int:
    """What ``du`` counts: allocated blocks, not apparent sizes."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


async def stream_sizes(conn: Connection) -> dict[str, dict[str, int]]:
    infos = await conn.js.streams_info()
    return {
        i.config.name or "?": {"messages": int(i.state.messages), "bytes": int(i.state.bytes)}
        for i in infos
    }


def pid_of(server: EmbeddedNatsServer) -> int:
    process = server._process  # for CPU and memory only; the pid is not public
    assert process is not None
    return process.pid


async def started(server: EmbeddedNatsServer) -> tuple[float, float]:
    """Seconds from process creation until JetStream answers, and the server's CPU by then."""
    began = time.perf_counter()
    await server.start(timeout=START_TIMEOUT)
    return time.perf_counter() - began, cpu_seconds(pid_of(server))


async def cycles(port: int, clients: int, seconds: float, pids: dict[str, int]) -> Load:
    conns = [await HttpConnection.open(port) for _ in range(clients)]
    try:
        load = Load("leases")
        return await drive(load, clients, http_cycle(conns, load), seconds, pids)
    finally:
        for http in conns:
            await http.close()


async def until_cycle(port: int, timeout: float) -> int:
    """Until one acquire+release cycle succeeds; the cycles that failed before it."""
    deadline = time.perf_counter() + timeout
    failed = 0
    while time.perf_counter() < deadline:
        load = Load("restart")
        try:
            http = await HttpConnection.open(port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        try:
            await http_cycle([http], load)(0)
        except (OSError, ConnectionError, ValueError):
            pass
        finally:
            await http.close()
        if load.cycles:
            return failed
        failed += 1
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no lease cycle succeeded within {timeout:.0f} s of the restart")


async def until_status(port: int, path: str, timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while (await http_get(port, path, 5.0))[0] != 200:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{path} not 200 within {timeout:.0f} s")
        await asyncio.sleep(0.02)


async def restart(server: EmbeddedNatsServer, api: Child, api_port: int) -> Restart:
    before = Process.of(pid_of(server))
    api_cpu = cpu_seconds(api.pid)
    await server.kill()
    began = time.perf_counter()
    jetstream_s, jetstream_cpu = await started(server)
    await until_status(api_port, "/healthz", START_TIMEOUT)
    healthz_s = time.perf_counter() - began
    failed = await until_cycle(api_port, START_TIMEOUT)
    cycle_s = time.perf_counter() - began
    discovery_cpu = cpu_seconds(api.pid) - api_cpu
    pid = pid_of(server)
    await idle(pid, limit=300.0)
    return Restart(
        jetstream_s=round(jetstream_s, 2),
        jetstream_cpu_s=round(jetstream_cpu, 2),
        idle_cpu_s=round(cpu_seconds(pid), 2),
        before=before,
        after=Process.of(pid),
        discovery_healthz_s=round(healthz_s, 2),
        discovery_cycle_s=round(cycle_s, 2),
        discovery_cpu_s=round(discovery_cpu, 2),
        failed_cycles=failed,
    )


@dataclass(frozen=True, slots=True)
class Config:
    sizes: tuple[int, ...] = (1_000, 100_000)
    clients: int = 32
    lease_seconds: float = 8.0
    lease_rounds: int = 2
    timeout: float = 900.0
    restart_sizes: tuple[int, ...] | None = None
    """The sizes whose server is killed and started again; None: every size."""


async def measure_size(tmp: Path, proxies: int, config: Config, say: Callable[[str], None]) -> Size:
    def fleet() -> Iterator[History]:
        for i in range(proxies):
            uid = proxy_uid(i)
            yield ready_history(uid, f"http://127.0.0.1:3128/{uid}")

    data = tmp / f"store-{proxies}"
    fill = await fill_store(data, lambda conn: publish_fleet(conn.js, fleet()))
    say(f"{proxies:,} proxies: filled {fill.events:,} events in {fill.seconds:,.1f} s")
    size = Size(proxies, fill, loads=[load1()])
    server = EmbeddedNatsServer(data_dir=data)
    size.start_s, size.start_cpu_s = await started(server)
    try:
        await idle(pid_of(server), limit=120.0)
        size.server = Process.of(pid_of(server))
        conn = await connect(server.url, name="bench-scale-server")
        try:
            size.streams = await stream_sizes(conn)
        finally:
            await conn.close()
        size.disk_bytes = disk_bytes(data / "jetstream")
        say(
            f"  server: started in {size.start_s:.2f} s ({size.start_cpu_s:.2f} CPU-s), "
            f"{size.server.rss_mb:.0f} MB resident, {size.disk_bytes / 1e6:,.0f} MB on disk"
        )
        api_port, metrics_port = free_port(), free_port()
        flags = ("--port", str(api_port), "--lease-cooldown", "0")
        argv = service_argv("discovery", server.url, metrics_port, *flags)
        async with running("discovery", argv, tmp / f"discovery-{proxies}.log") as api:
            size.discovery_caught_up_s = await until_healthz(api, api_port, config.timeout)
            await idle(api.pid, limit=config.timeout)
            size.discovery = Process.of(api.pid)
            size.server_with_discovery = Process.of(pid_of(server))
            say(
                f"  discovery: caught up in {size.discovery_caught_up_s:.1f} s, "
                f"{size.discovery.rss_mb:.0f} MB resident, {size.discovery.cpu_s:.1f} CPU-s"
            )
            pids = {"api": api.pid, "nats-server": pid_of(server)}
            await cycles(api_port, config.clients, min(1.0, config.lease_seconds), pids)
            size.loads.append(load1())
            for _ in range(config.lease_rounds):
                round_ = Cycles.of(
                    await cycles(api_port, config.clients, config.lease_seconds, pids)
                )
                size.cycles.append(round_)
                say(
                    f"  leases: {round_.cycles:,} cycles, API {round_.api_us:,.0f} µs and "
                    f"server {round_.server_us:,.0f} µs a cycle, errors {round_.errors}"
                )
            size.loads.append(load1())
            if config.restart_sizes is not None and proxies not in config.restart_sizes:
                return size
            size.restart = r = await restart(server, api, api_port)
            size.loads.append(load1())
            say(
                f"  restart: JetStream in {r.jetstream_s:.2f} s ({r.jetstream_cpu_s:.2f} CPU-s, "
                f"{r.idle_cpu_s:.2f} until idle), discovery serving {r.discovery_healthz_s:.2f} s "
                f"and leasing {r.discovery_cycle_s:.2f} s after the new server's creation"
            )
    finally:
        await server.stop()
    return size


async def measure(tmp: Path, config: Config, say: Callable[[str], None] = print) -> list[Size]:
    return [await measure_size(tmp, n, config, say) for n in config.sizes]


def report(sizes: list[Size], config: Config) -> dict[str, object]:
    summaries = [s.summary() for s in sizes]
    out: dict[str, object] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "config": asdict(config),
        "summary": summaries,
        "sizes": [asdict(s) for s in sizes],
    }
    if len(sizes) >= 2 and sizes[0].cycles and sizes[-1].cycles:
        small, large = summaries[0], summaries[-1]
        base = float(str(small["cycle_api_us"])) or 1.0
        out["cycle_api_growth"] = round(float(str(large["cycle_api_us"])) / base, 2)
    return out


def render(sizes: list[Size], console: Console) -> None:
    """One row per size: what docs/benchmarks.md ("10^5 proxies for real") reports."""
    table = Table(title="the server and discovery with a Ready fleet (CPU from /proc)")
    columns = (
        "proxies",
        "server RSS MB",
        "streams MB",
        "on disk MB",
        "clean start s (CPU)",
        "discovery caught up s, RSS MB",
        "API / server µs a cycle",
        "kill -9: JetStream s (CPU, until idle)",
        "RSS MB after",
        "discovery serving / leasing s",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for size in sizes:
        s = size.summary()
        r = size.restart
        table.add_row(
            f"{size.proxies:,}",
            f"{s['server_rss_mb']}",
            f"{int(str(s['stream_bytes'])) / 1e6:,.1f}",
            f"{size.disk_bytes / 1e6:,.1f}",
            f"{size.start_s:.2f} ({size.start_cpu_s:.2f})",
            f"{size.discovery_caught_up_s:.1f}, {s['discovery_rss_mb']}",
            f"{s['cycle_api_us']:,} / {s['cycle_server_us']:,}",
            f"{r.jetstream_s:.2f} ({r.jetstream_cpu_s:.2f}, {r.idle_cpu_s:.2f})" if r else "-",
            f"{r.after.rss_mb}" if r else "-",
            f"{r.discovery_healthz_s:.2f} / {r.discovery_cycle_s:.2f}" if r else "-",
        )
    console.print(table)
    console.print(f"load average (1 min) at each step: {[s.loads for s in sizes]}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_server", description=__doc__)
    parser.add_argument("--sizes", default="1000,100000", help="proxies, comma-separated")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--lease-seconds", type=float, default=8.0)
    parser.add_argument("--lease-rounds", type=int, default=2)
    parser.add_argument("--workdir", help="keep the stores and logs here (default: temporary)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    config = Config(
        sizes=tuple(int(s) for s in args.sizes.split(",")),
        clients=args.clients,
        lease_seconds=args.lease_seconds,
        lease_rounds=args.lease_rounds,
    )
    configure_logging("error")

    async def run(tmp: Path) -> list[Size]:
        return await measure(tmp, config)

    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        sizes = asyncio.run(run(Path(args.workdir)))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-scale-server-") as tmp:
            sizes = asyncio.run(run(Path(tmp)))
    doc = report(sizes, config)
    render(sizes, Console(width=220))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
