"""The parts bench/gateway.py measures with: a fast local site, a Squid that may tunnel to it,
ab's figures, a client that downloads through a CONNECT tunnel, and a process's CPU and RSS."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from services.providers import local_process as proc
from services.providers.pure.targets import AllowedTarget
from services.runtime.ports import free_port
from tests.support.waiting import listening, until

SMALL = b"x" * 1024
CHUNK = b"y" * (1 << 20)


@dataclass
class Site:
    port: int
    megabytes: int


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mb: int) -> None:
    """HTTP/1.1 keep-alive: ``/1k`` answers 1 KiB, ``/big`` answers ``mb`` MiB."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.split(b" ", 2)[1].endswith(b"/big"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (mb << 20))
                for _ in range(mb):
                    writer.write(CHUNK)
                    await writer.drain()
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1024\r\n\r\n" + SMALL)
                await writer.drain()
    except (asyncio.IncompleteReadError, OSError, IndexError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def site(megabytes: int) -> AsyncIterator[Site]:
    server = await asyncio.start_server(
        lambda r, w: _serve(r, w, megabytes), "127.0.0.1", 0, backlog=4096
    )
    try:
        yield Site(server.sockets[0].getsockname()[1], megabytes)
    finally:
        server.close()


@dataclass(frozen=True, slots=True)
class Squid:
    port: int
    pid: int
    directory: Path


@contextlib.asynccontextmanager
async def squid(directory: Path, site_port: int) -> AsyncIterator[Squid]:
    """The local provider's Squid, told it may reach the site (plain HTTP and CONNECT:
    ``allowedTargets``), without lease credentials: the same Squid for both arms."""
    await asyncio.to_thread(directory.mkdir, parents=True)
    port = free_port()
    targets = (AllowedTarget(cidr="127.0.0.1/32", ports=(site_port,)),)
    command = proc.prepare(proc.SQUID, directory, port, "bench-gw", targets=targets)
    running = Squid(port, proc.spawn(command, directory), directory)
    try:
        await until(lambda: proc.accepts(port), timeout=30, what="the bench's Squid")
        yield running
    finally:
        await proc.terminate(running.pid, directory, grace=1.0)
        proc.remove_leftovers(directory)


@dataclass(frozen=True, slots=True)
class Ab:
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    failed: int
    non_2xx: int
    mean_ms: float = 0.0
    """ab's mean time per request across all concurrent requests' wall time, to the µs."""


async def ab(
    proxy_port: int, url: str, requests: int, concurrency: int, login: str | None = None
) -> Ab:
    """ApacheBench through a proxy, keep-alive."""
    command = ["ab", "-q", "-k", "-n", str(requests), "-c", str(concurrency)]
    command += ["-X", f"127.0.0.1:{proxy_port}"]
    if login is not None:
        command += ["-P", login]
    process = await asyncio.create_subprocess_exec(
        *command, url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    text = out.decode()
    if process.returncode != 0:
        raise RuntimeError(f"ab failed: {err.decode()[-500:]}")
    return Ab(
        requests_per_second=_number(r"Requests per second:\s+([\d.]+)", text),
        p50_ms=_number(r"\n\s+50%\s+(\d+)", text),
        mean_ms=_number(r"Time per request:\s+([\d.]+) \[ms\] \(mean\)", text),
        p99_ms=_number(r"\n\s+99%\s+(\d+)", text),
        failed=int(_number(r"Failed requests:\s+(\d+)", text)),
        non_2xx=int(_number(r"Non-2xx responses:\s+(\d+)", text, default=0.0)),
    )


def _number(pattern: str, text: str, default: float | None = None) -> float:
    found = re.search(pattern, text)
    if found is None:
        if default is not None:
            return default
        raise RuntimeError(f"ab's report has no {pattern!r}:\n{text[-2000:]}")
    return float(found[1])


async def tunnel_download(proxy_port: int, site: Site, login: str | None = None) -> float:
    """Seconds to download the site's ``/big`` through a CONNECT tunnel of the proxy."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port, limit=1 << 20)
    try:
        auth = ""
        if login is not None:
            auth = f"Proxy-Authorization: Basic {base64.b64encode(login.encode()).decode()}\r\n"
        target = f"127.0.0.1:{site.port}"
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"the tunnel was refused: {head[:200]!r}")
        started = time.perf_counter()
        writer.write(b"GET /big HTTP/1.1\r\nHost: site\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        left = site.megabytes << 20
        while left > 0:
            data = await reader.read(1 << 20)
            if not data:
                raise RuntimeError(f"the tunnel closed with {left} bytes to go")
            left -= len(data)
        return time.perf_counter() - started
    finally:
        writer.close()


def cpu_seconds(pid: int) -> float:
    """User and system CPU of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime, stime in clock ticks


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def hold_connections(
    port: int, count: int, url: str, login: str
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``count`` keep-alive connections, each after one request through the gateway, from
    127.0.0.2 on, 1,000 per address (the gateway bounds connections per address)."""
    auth = base64.b64encode(login.encode()).decode()
    request = (
        f"GET {url} HTTP/1.1\r\nHost: site\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    ).encode()
    held = []
    for n in range(count):
        source = (f"127.0.{2 + n // 250_000}.{2 + (n // 1000) % 250}", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=source)
        writer.write(request)
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(1024)
        held.append((reader, writer))
    return held


@contextlib.asynccontextmanager
async def relay_floor(upstream_port: int) -> AsyncIterator[tuple[int, int]]:
    """``bench.relay_floor`` in front of the proxy: its pid and port."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.relay_floor",
        "--port",
        str(port),
        "--upstream",
        f"127.0.0.1:{upstream_port}",
    )
    try:
        await until(lambda: listening(port), timeout=30, what="the relay floor listening")
        yield process.pid, port
    finally:
        process.kill()
        await process.wait()
