"""Health tests' helpers: an origin that records request headers, Ready proxies written straight
into the log (what the reconciler would write), and health replicas on their own connections."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from events import subjects
from events.schemas import (
    HealthChanged,
    HealthCheck,
    InstanceState,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
)
from events.store import EventStore, NewEvent, derive_msg_id
from services.health.service import HealthService
from services.providers.local import LocalProvider
from services.providers.pure.targets import AllowedTarget
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection, connect
from services.runtime.observability.metrics import Metrics
from services.runtime.service import ServiceContext
from services.runtime.settings.shared import Settings
from tests.contract.provider import request_factory
from tests.support.waiting import until


@dataclass
class RecordingTarget:
    """A keep-alive HTTP origin answering ``status`` to everything and recording each request's
    request line and headers (names lower-cased), as an external site would see them."""

    status: int = 204
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def url(self, path: str = "/check") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                self.requests.append((lines[0], headers))
                writer.write(
                    f"HTTP/1.1 {self.status} X\r\nContent-Length: 0\r\n\r\n".encode("latin-1")
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


@contextlib.asynccontextmanager
async def recording_target() -> AsyncIterator[RecordingTarget]:
    target = RecordingTarget()
    await target.start()
    try:
        yield target
    finally:
        await target.close()


def fast_check(url: str = "", *, failures: int = 2, successes: int = 1) -> HealthCheck:
    return HealthCheck(
        url=url,
        interval_seconds=0.2,
        timeout_seconds=1.0,
        failure_threshold=failures,
        success_threshold=successes,
    )


async def declare_ready(
    store: EventStore, uid: str, proxy_url: str, check: HealthCheck, provider_id: str = ""
) -> None:
    """A declared proxy whose instance the reconciler declared Ready at ``proxy_url``."""
    events = [
        ProxyDeclared(
            uid=uid,
            namespace="default",
            name=uid,
            spec=ProxySpec(provider="local", health_check=check),
        ),
        PhaseChanged(
            phase=Phase.READY,
            reason="InstanceRunning",
            ip="127.0.0.1",
            url=proxy_url,
            provider_id=provider_id or f"inst-{uid}",
        ),
    ]
    await store.append(
        subjects.proxy(uid),
        [NewEvent(e, derive_msg_id("test", uid, str(i))) for i, e in enumerate(events)],
        expected_seq=0,
    )


async def health_events(store: EventStore, uid: str) -> list[HealthChanged]:
    history = await store.read(subjects.proxy(uid))
    return [r.event for r in history.events if isinstance(r.event, HealthChanged)]


@dataclass
class Replica:
    service: HealthService
    conn: Connection
    task: asyncio.Task[None]

    async def crash(self) -> None:
        """Die as ``kill -9`` would, as far as NATS can tell: the connection goes first, so the
        replica never deletes its membership key and the others wait for it to expire."""
        await self.conn.nc.close()
        self.task.cancel()
        # Whatever the dying replica raised on its way down (its connection is gone) is moot.
        await asyncio.gather(self.task, return_exceptions=True)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.conn.close()


def replica_service(name: str, check_url: str) -> HealthService:
    """A health replica as the health tests run one: a 0.2 s heartbeat, so it takes its
    proxies at once, and no latency band, so the log holds a verdict only where health changed
    and a test can count them."""
    return HealthService(check_url=check_url, heartbeat=0.2, replica_id=name, latency_band_ms=0)


async def start_replica(url: str, service: HealthService) -> Replica:
    conn = await connect(url)
    ctx = ServiceContext(
        settings=Settings(nats_url=url),
        conn=conn,
        store=JetStreamEventStore(conn.nc, conn.js),
        metrics=Metrics(),
    )
    task = asyncio.create_task(service.run(ctx), name=f"health {service.replica_id}")
    return Replica(service, conn, task)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Squid:
    """One real Squid from the local provider, on a port it always gets back."""

    def __init__(self, data_dir: Path) -> None:
        port = free_port()
        self.provider = LocalProvider(
            "local",
            data_dir,
            backend="squid",
            port_range=(port, port),
            stop_grace=0.5,
            # https checks tunnel to TLS servers on random loopback ports: listed, as an
            # operator lists an intranet's (D134).
            targets=(AllowedTarget(cidr="127.0.0.1/32", ports=("1024-65535",)),),
        )
        self.make = request_factory("local")
        self.url = f"http://127.0.0.1:{port}"

    async def start(self) -> None:
        await self.provider.create(self.make("squid"))

        async def running() -> bool:
            return (await self.provider.get("squid")).state is InstanceState.RUNNING

        await until(running, timeout=30)

    def kill(self) -> None:
        meta = self.provider.data_dir / "instances" / "squid" / "meta.json"
        os.kill(json.loads(meta.read_text())["pid"], signal.SIGKILL)

    async def restart(self) -> None:
        """A new Squid process on the same port (the only one in the provider's range)."""
        await self.provider.delete("squid")
        await self.start()
