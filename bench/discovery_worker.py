"""The processes, the set-up and the client of the discovery benchmarks.

The API runs as its own process, as a deployment runs it, so the clients' CPU is not the
server's: ``python -m bench.discovery_worker NATS_URL [--cooldown S] [--loop uvloop|asyncio]
[--profile FILE]`` prints ``ready <port> <event loop> <HTTP protocol>`` once it listens and stops
cleanly on SIGTERM (writing cProfile stats first, with ``--profile``).

The service runs uvicorn inside the process's own event loop (``Server.serve``), so uvicorn's
``loop="auto"`` never applies: the loop is whatever the process started, uvloop as ``up`` and
``run`` start it (``--event-loop``), or the standard one with ``--loop asyncio``. Its
``http="auto"`` does apply:
httptools when installed, h11 otherwise. The ready line names both, so a run records what it
measured.

The client is a few lines of HTTP/1.1 over one keep-alive connection per simulated crawler. A
general-purpose client (httpx) costs several times the server's work per request, and on a
small machine the benchmark would then measure its own client; this one costs little, and costs
the same whichever route it asks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.loops import LOOPS, loop_factory
from events import subjects
from events.schemas import HealthChanged, Phase, PhaseChanged, ProxyDeclared, ProxySpec
from events.store import NewEvent
from services.discovery.service import DiscoveryService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.logs import configure_logging
from services.runtime.service import Started, run_services
from services.runtime.settings.shared import Settings

ROOT = Path(__file__).resolve().parents[1]
# ------------------------------------------------------------------------- the worker process


async def serve(url: str, cooldown: float) -> None:
    """Run the discovery service until SIGTERM."""
    service = DiscoveryService(
        host="127.0.0.1", port=0, max_lease_ttl=3600.0, lease_cooldown=cooldown
    )
    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main.cancel)
    announced: list[asyncio.Task[None]] = []

    async def announce() -> None:
        await service.listening.wait()
        print(f"ready {service.bound_port} {loop_name()} {http_protocol()}", flush=True)

    def started(_: Started) -> None:
        announced.append(loop.create_task(announce()))

    settings = Settings(nats_url=url, service_name="bench-discovery")
    with contextlib.suppress(asyncio.CancelledError):
        await run_services([service], settings, on_started=started)


def loop_name() -> str:
    """The running event loop's package: ``asyncio`` or ``uvloop``."""
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def http_protocol() -> str:
    """What uvicorn's ``http="auto"`` (the service's setting) resolves to here."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol  # noqa: PLC0415

    return "httptools" if "HttpTools" in AutoHTTPProtocol.__name__ else "h11"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.discovery_worker")
    parser.add_argument("nats_url")
    parser.add_argument("--cooldown", type=float, default=0.0)
    parser.add_argument("--loop", choices=LOOPS, default="uvloop")
    parser.add_argument("--profile", help="write cProfile stats here on exit")
    args = parser.parse_args()
    configure_logging("warning", stream=sys.stderr)
    factory = loop_factory(args.loop)
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(args.nats_url, args.cooldown))
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)


# ------------------------------------------------------------------ the benchmark's side of it


@dataclass
class Api:
    process: asyncio.subprocess.Process
    port: int
    loop: str = ""
    """The worker's event loop (``asyncio`` or ``uvloop``)."""
    http: str = ""
    """uvicorn's HTTP protocol in the worker (``httptools`` or ``h11``)."""

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
        try:
            await asyncio.wait_for(self.process.wait(), 30.0)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


async def spawn(
    url: str,
    log: Path,
    *,
    cooldown: float = 0.0,
    profile: Path | None = None,
    loop: str = "uvloop",
) -> Api:
    """Tracing stays off in the worker (no OTEL_* variables): an exporter is not measured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    args = [sys.executable, "-m", "bench.discovery_worker", url, "--cooldown", str(cooldown)]
    args += ["--loop", loop]
    if profile is not None:
        args += ["--profile", str(profile)]
    with log.open("ab") as err:
        process = await asyncio.create_subprocess_exec(
            *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=err
        )
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 60.0)
    except TimeoutError:
        line = b""
    words = line.decode().split()
    if len(words) != 4 or words[0] != "ready":
        with contextlib.suppress(ProcessLookupError):  # it may have exited already
            process.kill()
        await process.wait()
        raise RuntimeError(f"the discovery worker did not start; see {log}")
    return Api(process, int(words[1]), loop=words[2], http=words[3])


@dataclass
class Setup:
    """One run's nats-server (product configuration), the benchmark's connection, the APIs."""

    server: EmbeddedNatsServer
    conn: Connection
    apis: list[Api] = field(default_factory=list)

    @property
    def store(self) -> JetStreamEventStore:
        return JetStreamEventStore(self.conn.nc, self.conn.js)

    def pids(self) -> dict[str, int]:
        process = self.server._process  # for CPU accounting only; the pid is not public
        pids = {f"api-{i}" if i else "api": a.process.pid for i, a in enumerate(self.apis)}
        return {**pids, "nats-server": process.pid if process is not None else -1}


async def seed(store: JetStreamEventStore, proxies: int) -> None:
    """Ready, healthy proxies, recorded the way the reconciler and the health service record
    them: the API reads only the log."""
    for i in range(proxies):
        uid = f"bench-{i}"
        spec = ProxySpec(provider="bench", attributes={"pool": "bench"})
        declared = ProxyDeclared(uid=uid, namespace="bench", name=uid, spec=spec)
        ready = PhaseChanged(phase=Phase.READY, ip="127.0.0.1", url=f"http://127.0.0.1:{i + 1}")
        healthy = HealthChanged(healthy=True, reason="ProbeSucceeded", latency_ms=5.0)
        events = [NewEvent(e, f"{uid}-{n}") for n, e in enumerate((declared, ready, healthy))]
        await store.append(subjects.proxy(uid), events)


@contextlib.asynccontextmanager
async def setup(
    tmp: Path, *, proxies: int, apis: int, profile: Path | None = None, loop: str = "uvloop"
) -> AsyncIterator[Setup]:
    """A fresh server with ``proxies`` Ready proxies, then ``apis`` API processes on it, each
    on the event loop ``loop``."""
    server = EmbeddedNatsServer(tmp / "nats")
    await server.start()
    conn = await connect(server.url, name="bench")
    running = Setup(server, conn)
    try:
        await ensure_streams(conn.js)
        await seed(running.store, proxies)
        for i in range(apis):
            log = tmp / f"api-{i}.log"
            running.apis.append(await spawn(server.url, log, profile=profile, loop=loop))
        yield running
    finally:
        for api in running.apis:
            await api.stop()
        await conn.close()
        await server.stop()


class HttpConnection:
    """HTTP/1.1 requests, one at a time, on one keep-alive connection.

    uvicorn closes a connection idle for 5 s (its keep-alive timeout), as the clients' are while
    another phase runs; the next request then opens a new one.
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.host = host
        self.port = port
        self.reopened = 0

    @classmethod
    async def open(cls, port: int, host: str = "127.0.0.1") -> HttpConnection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, host, port)

    async def request(
        self, method: str, path: str, body: object = None
    ) -> tuple[int, dict[str, str], bytes]:
        if self.reader.at_eof():
            # Closed by the server while idle: it never saw a request on it.
            await self.close()
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.reopened += 1
        data = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(data)}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        self.writer.write(head.encode() + b"\r\n" + data)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split(b" ", 2)[1])
        headers: dict[str, str] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        return status, headers, await self.reader.readexactly(length) if length else b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


if __name__ == "__main__":
    main()
