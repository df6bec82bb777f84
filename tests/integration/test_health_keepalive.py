"""Idle connections are kept only for frequent probes: a proxy probed further apart than
``--health-keep-alive`` gets a new connection per probe, asks for ``Connection: close`` and leaves
nothing open between probes (an idle connection costs memory for the whole interval,
docs/benchmarks.md); an ``https`` check keeps its tunnel at any interval (a new one costs a TLS
handshake)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import trustme

from events.schemas import HealthCheck
from services.health.probe_client import CheckUrl, ProbeClient
from services.health.service import HealthService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.health import RecordingTarget, Squid, declare_ready, start_replica
from tests.support.waiting import until

pytestmark = pytest.mark.integration


@dataclass
class CountingProxy:
    """Stands in for a proxy: answers absolute-URI GETs 204 on a keep-alive connection, and after
    a ``CONNECT`` it completes TLS with ``tls`` and answers inside the tunnel. Counts the
    connections it accepted, those still open, and the ``Connection`` header of each request."""

    tls: ssl.SSLContext | None = None
    accepted: int = 0
    open: int = 0
    connection_headers: list[str] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open += 1
        self._writers.add(writer)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                if head.startswith("CONNECT ") and self.tls is not None:
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    await writer.drain()
                    await writer.start_tls(self.tls)
                    continue
                lines = [line.partition(":") for line in head.split("\r\n")[1:]]
                headers = {k.strip().lower(): v.strip() for k, sep, v in lines if sep}
                self.connection_headers.append(headers.get("connection", ""))
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            self.open -= 1
            self._writers.discard(writer)
            writer.close()


@contextlib.asynccontextmanager
async def counting_proxy(tls: ssl.SSLContext | None = None) -> AsyncIterator[CountingProxy]:
    proxy = CountingProxy(tls)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


def check(url: str, interval: float) -> HealthCheck:
    return HealthCheck(url=url, interval_seconds=interval, timeout_seconds=2.0)


async def test_a_probe_without_keep_alive_asks_to_close_and_leaves_nothing_open() -> None:
    client = ProbeClient()
    target = CheckUrl.parse("http://example.test/generate_204")
    async with counting_proxy() as proxy:
        try:
            for _ in range(3):
                assert (await client.probe(proxy.url, target, 2.0, keep_alive=False)).ok
            assert client.idle == 0
            await until(lambda: proxy.open == 0, what="the proxy saw every connection closed")
            assert proxy.accepted == 3
            assert proxy.connection_headers == ["close"] * 3

            for _ in range(3):
                assert (await client.probe(proxy.url, target, 2.0)).ok
            assert client.idle == 1
            assert proxy.accepted == 4, "kept-alive probes share one connection"
            assert proxy.connection_headers[3:] == ["keep-alive"] * 3

            # A kept connection serves a probe that does not keep, and is closed after it.
            assert (await client.probe(proxy.url, target, 2.0, keep_alive=False)).ok
            assert client.idle == 0
            assert proxy.accepted == 4
            await until(lambda: proxy.open == 0, what="the kept connection closed")
        finally:
            await client.close()


async def test_a_probe_without_keep_alive_through_squid(
    squid: Squid, target: RecordingTarget
) -> None:
    client = ProbeClient()
    try:
        results = [
            await client.probe(squid.url, CheckUrl.parse(target.url()), 5.0, keep_alive=False)
            for _ in range(3)
        ]
    finally:
        await client.close()
    assert [r.outcome for r in results] == ["ok"] * 3, results
    assert client.idle == 0
    assert len(target.requests) == 3


async def test_the_prober_keeps_connections_only_for_probes_within_the_bound(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    async with (
        counting_proxy() as often,
        counting_proxy() as seldom,
        counting_proxy(server_tls) as tunnelled,
    ):
        http_url = "http://example.test/generate_204"
        await declare_ready(jetstream_store, "often", often.url, check(http_url, 0.2))
        await declare_ready(jetstream_store, "seldom", seldom.url, check(http_url, 0.5))
        https_url = "https://localhost/generate_204"
        await declare_ready(jetstream_store, "tunnelled", tunnelled.url, check(https_url, 0.5))
        service = HealthService(
            check_url=http_url,
            heartbeat=0.2,
            replica_id="keeper",
            latency_band_ms=0,
            keep_alive_seconds=0.3,
            client=ProbeClient(ssl_context=client_tls),
        )
        replica = await start_replica(nats_server.url, service)
        try:
            proxies = (often, seldom, tunnelled)
            await until(
                lambda: all(len(p.connection_headers) >= 3 for p in proxies),
                what="three probes of each proxy",
            )
        finally:
            await replica.stop()
    assert often.accepted == 1, "probes 0.2 s apart share one connection"
    assert set(often.connection_headers) == {"keep-alive"}
    # A probe may be on its new connection, not yet read, when the replica stops.
    assert seldom.accepted >= len(seldom.connection_headers), "one connection per probe"
    assert set(seldom.connection_headers) == {"close"}
    assert tunnelled.accepted == 1, "an https check keeps its tunnel at any interval"
    assert set(tunnelled.connection_headers) == {"keep-alive"}
