"""The gateway's cost: through the gateway against straight to the proxy it leases, same run.

One local Squid (the local provider's, told it may reach the bench's site), a discovery replica
leasing it, and the gateway as its own process (`egress-proxies run gateway`, with a clients
file), so its CPU is its own. Alternated in rounds, each arm on the same machine:

- **small**: ApacheBench, keep-alive, ``--concurrency`` at once, GET of 1 KiB: straight to the
  Squid, and through the gateway (a proxy per request: no session). Targets (issue 38): the
  gateway's requests/s >= 0.8x the direct, added p50 <= 1 ms.
- **tunnel**: a ``--megabytes`` download through a CONNECT tunnel, straight and through the
  gateway. Target: >= 0.9x the bytes/s.
- the gateway's CPU per request and per MB, and its RSS with ``--connections`` open (idle
  keep-alive connections that each made one request).
- **pinned**, once after the rounds: both small arms again with the gateway on one core and ab,
  the Squid and the site on the other, as when the gateway runs in pods of its own and does not
  take the proxy's core (reported beside the shared figures, never instead of them).

    python -m bench.gateway --requests 20000 --concurrency 32 --megabytes 100 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from statistics import median
from typing import Any

from bench.gateway_parts import (
    Ab,
    Site,
    Squid,
    ab,
    cpu_seconds,
    hold_connections,
    relay_floor,
    rss_mb,
    site,
    squid,
    tunnel_download,
)
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import connect
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.pure.clients import hash_token
from tests.support.discovery import discovery, ready_proxy
from tests.support.gateway import gateway_process

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-gateway-token-" + "0" * 24
CLIENT = "bench"
RPS_TARGET = 0.8
P50_TARGET_MS = 1.0
TUNNEL_TARGET = 0.9


def clients_file(work: Path) -> Path:
    path = work / "clients.yaml"
    path.write_text(
        f"clients:\n  - {{name: {CLIENT}, token: '{hash_token(TOKEN)}', scopes: [lease, read]}}\n"
    )
    return path


async def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    server = EmbeddedNatsServer(data_dir=work / "nats")
    await server.start()
    try:
        conn = await connect(server.url)
        try:
            await ensure_streams(conn.js)
            store = JetStreamEventStore(conn.nc, conn.js)
            clients = clients_file(work)
            async with (
                site(args.megabytes) as origin,
                squid(work / "squid", origin.port) as proxy,
                discovery(server.url, lease_cooldown=0.0, clients_file=clients) as (_, api),
            ):
                await ready_proxy(store, "bench-gw", port=proxy.port)
                async with (
                    gateway_process(server.url, api, clients) as (pid, port),
                    relay_floor(proxy.port) as floor,
                ):
                    result = await rounds(args, origin, proxy, port, pid, floor=floor)
                    small = f"http://127.0.0.1:{origin.port}/1k"
                    result["pinned"] = await pinned_arms(
                        args, small, ports=(proxy.port, port), pids=(proxy.pid, pid)
                    )
                    return result
        finally:
            await conn.close()
    finally:
        await server.stop()


async def rounds(
    args: argparse.Namespace,
    origin: Site,
    proxy: Squid,
    port: int,
    pid: int,
    *,
    floor: tuple[int, int],
) -> dict[str, Any]:
    """The arms, alternated; each arm's CPU per request is the gateway's, Squid's and this
    process's (the site): where the cores go decides what a second hop can reach."""
    squid_port = proxy.port
    small = f"http://127.0.0.1:{origin.port}/1k"
    login = f"{CLIENT}:{TOKEN}"
    await ab(port, small, 200, 4, login)  # leases taken, connections warm
    direct: list[Ab] = []
    through: list[Ab] = []
    tunnel_direct: list[float] = []
    tunnel_through: list[float] = []
    cpu_per_request: list[float] = []
    cpu_per_mb: list[float] = []
    squid_direct: list[float] = []
    squid_through: list[float] = []
    site_direct: list[float] = []
    site_through: list[float] = []
    floor_rps: list[float] = []
    floor_cpu: list[float] = []
    floor_tunnel: list[float] = []
    floor_cpu_mb: list[float] = []
    floor_pid, floor_port = floor
    for _ in range(args.rounds):
        before = cpu_seconds(floor_pid)
        floor_rps.append(
            (await ab(floor_port, small, args.requests, args.concurrency)).requests_per_second
        )
        floor_cpu.append((cpu_seconds(floor_pid) - before) / args.requests)
        before = cpu_seconds(floor_pid)
        floor_tunnel.append(await tunnel_download(floor_port, origin))
        floor_cpu_mb.append((cpu_seconds(floor_pid) - before) / args.megabytes)
        squid_before, site_before = cpu_seconds(proxy.pid), time.process_time()
        direct.append(await ab(squid_port, small, args.requests, args.concurrency))
        squid_direct.append((cpu_seconds(proxy.pid) - squid_before) / args.requests)
        site_direct.append((time.process_time() - site_before) / args.requests)
        before, squid_before = cpu_seconds(pid), cpu_seconds(proxy.pid)
        site_before = time.process_time()
        through.append(await ab(port, small, args.requests, args.concurrency, login))
        cpu_per_request.append((cpu_seconds(pid) - before) / args.requests)
        squid_through.append((cpu_seconds(proxy.pid) - squid_before) / args.requests)
        site_through.append((time.process_time() - site_before) / args.requests)
        tunnel_direct.append(await tunnel_download(squid_port, origin))
        before = cpu_seconds(pid)
        tunnel_through.append(await tunnel_download(port, origin, login))
        cpu_per_mb.append((cpu_seconds(pid) - before) / args.megabytes)
    # One request at a time: no queue, so what a request waits is what the hop adds to it.
    light_direct = [await ab(squid_port, small, args.requests // 10, 1) for _ in range(2)]
    light_through = [await ab(port, small, args.requests // 10, 1, login) for _ in range(2)]
    added_light = median(t.mean_ms for t in light_through) - median(d.mean_ms for d in light_direct)
    rss_before = rss_mb(pid)
    held = await hold_connections(port, args.connections, small, login)
    rss_held = rss_mb(pid)
    for _, writer in held:
        writer.close()
    rps = median(t.requests_per_second for t in through) / median(
        d.requests_per_second for d in direct
    )
    added_p50 = median(t.p50_ms for t in through) - median(d.p50_ms for d in direct)
    tunnel = median(tunnel_direct) / median(tunnel_through)
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "arguments": vars(args),
        "direct": [asdict(a) for a in direct],
        "through_gateway": [asdict(a) for a in through],
        "requests_per_second_ratio": round(rps, 3),
        "added_p50_ms": added_p50,
        "one_at_a_time_ms": {
            "direct": [d.mean_ms for d in light_direct],
            "through_gateway": [t.mean_ms for t in light_through],
            "added": round(added_light, 3),
        },
        "tunnel_mb_per_second": {
            "direct": [round(args.megabytes / s, 1) for s in tunnel_direct],
            "through_gateway": [round(args.megabytes / s, 1) for s in tunnel_through],
        },
        "tunnel_ratio": round(tunnel, 3),
        "gateway_cpu_us_per_request": [round(c * 1e6, 1) for c in cpu_per_request],
        "squid_cpu_us_per_request": {
            "direct": [round(c * 1e6, 1) for c in squid_direct],
            "through_gateway": [round(c * 1e6, 1) for c in squid_through],
        },
        "site_cpu_us_per_request": {
            "direct": [round(c * 1e6, 1) for c in site_direct],
            "through_gateway": [round(c * 1e6, 1) for c in site_through],
        },
        "gateway_cpu_ms_per_mb": [round(c * 1e3, 2) for c in cpu_per_mb],
        "relay_floor": {
            "requests_per_second": [round(r) for r in floor_rps],
            "cpu_us_per_request": [round(c * 1e6, 1) for c in floor_cpu],
            "tunnel_mb_per_second": [round(args.megabytes / s, 1) for s in floor_tunnel],
            "cpu_ms_per_mb": [round(c * 1e3, 2) for c in floor_cpu_mb],
        },
        "gateway_rss_mb": {"idle": round(rss_before, 1), "connections_open": round(rss_held, 1)},
        "targets": {
            "requests_per_second_ratio": f">= {RPS_TARGET}",
            "added_p50_ms": f"<= {P50_TARGET_MS}",
            "tunnel_ratio": f">= {TUNNEL_TARGET}",
        },
        "met": {
            "requests_per_second_ratio": rps >= RPS_TARGET,
            "added_p50_ms": added_p50 <= P50_TARGET_MS,
            "tunnel_ratio": tunnel >= TUNNEL_TARGET,
        },
    }


async def pinned_arms(
    args: argparse.Namespace, url: str, *, ports: tuple[int, int], pids: tuple[int, int]
) -> dict[str, Any] | None:
    """Both small arms once with the gateway alone on the first core and everything else the
    arms use (ab, the Squid, this process and its site) on the second; ``None`` on one core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    (squid_port, port), (squid_pid, pid) = ports, pids
    login = f"{CLIENT}:{TOKEN}"
    alone, rest = {cores[0]}, {cores[1]}
    saved = {p: os.sched_getaffinity(p) for p in (pid, squid_pid, os.getpid())}
    try:
        pin(pid, alone)
        pin(squid_pid, rest)
        pin(os.getpid(), rest)  # ab, started from here, inherits it
        direct = await ab(squid_port, url, args.requests, args.concurrency)
        before = cpu_seconds(pid)
        through = await ab(port, url, args.requests, args.concurrency, login)
        cpu = (cpu_seconds(pid) - before) / args.requests
    finally:
        for p, was in saved.items():
            pin(p, was)
    return {
        "cores": {"gateway": sorted(alone), "ab_squid_site": sorted(rest)},
        "direct": asdict(direct),
        "through_gateway": asdict(through),
        "requests_per_second_ratio": round(
            through.requests_per_second / direct.requests_per_second, 3
        ),
        "added_p50_ms": through.p50_ms - direct.p50_ms,
        "gateway_cpu_us_per_request": round(cpu * 1e6, 1),
    }


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` on ``cores`` (affinity is a thread's, not a process's)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cores)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=10_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as work:
        result = asyncio.run(measure(args, Path(work)))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
