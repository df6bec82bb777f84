"""The callbacks' path at its edges, on real sockets: the gateway listening on a port, a
listening socket standing for the leased proxy that answers as each test says, and a crawler's
socket. The lease is one the gateway holds already (its keeper's ring), so that the edges, not
the discovery API, are what is tested; ``Gateway.by_callbacks`` and ``handed_back`` tell which
path answered (docs/decisions/0166-the-gateway-s-callbacks-path.md)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from services.gateway.api import Api, Granted
from services.gateway.bounds import Limits
from services.gateway.leases import Caller, Held, Keeper, Ring
from services.gateway.metrics import gateway_metrics
from services.gateway.pure.username import Ask
from services.gateway.server import Gateway
from services.runtime.clients import Clients

pytestmark = pytest.mark.integration

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def get(path: str) -> bytes:
    return b"GET http://site.test/%s HTTP/1.1\r\nHost: site.test\r\n\r\n" % path.encode()


@contextlib.asynccontextmanager
async def setup(answers: list[Answer]) -> AsyncIterator[tuple[Gateway, int]]:
    """The gateway (open: no clients file) on a port, its one lease on the stand-in proxy,
    which answers the n-th request it reads with ``answers[n]``."""
    served = 0
    writers: list[asyncio.StreamWriter] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        writers.append(writer)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                answer, served = answers[served], served + 1
                await answer(reader, writer)
        writer.close()

    stand_in = await asyncio.start_server(proxy, "127.0.0.1", 0)
    port = stand_in.sockets[0].getsockname()[1]
    api = Api("http://127.0.0.1:9")  # never asked: the lease is held already
    keeper = Keeper(api, refresh=3600.0)
    now = time.monotonic()
    granted = Granted(
        "lease-1",
        "px-1",
        "crawl/px-1",
        f"http://127.0.0.1:{port}",
        600.0,
        datetime.now(UTC) + timedelta(seconds=600),
    )
    held = Held(granted, Caller("open", None), 600.0, expires=now + 600, checked=now)
    keeper.rings[("open", Ask().key())] = Ring([held], full_until=now + 3600)
    gateway = Gateway(
        keeper,
        Clients(None, None),
        gateway_metrics(CollectorRegistry()),
        limits=Limits(idle_timeout=0.5, answer_timeout=0.5),
    )
    server = await asyncio.get_running_loop().create_server(gateway.protocol, "127.0.0.1", 0)
    try:
        async with stand_in, server:
            yield gateway, server.sockets[0].getsockname()[1]
    finally:
        gateway.close()
        await api.aclose()
        for writer in writers:
            writer.close()
        await asyncio.sleep(0)


async def closed(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def answered(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await asyncio.wait_for(reader.readexactly(length), 5)


async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(OK)
    await writer.drain()


async def test_an_answer_cut_mid_body_is_counted_and_both_connections_close() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        await writer.drain()
        await closed(writer)

    async with setup([ok, cut]) as (gateway, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(get("first"))  # the login is checked: the coroutine's
        assert (await answered(reader)).endswith(b"\r\n\r\nok")
        writer.write(get("cut"))
        rest = await asyncio.wait_for(reader.read(), 5)  # until the gateway closes
        assert rest.startswith(b"HTTP/1.1 200 OK\r\n")
        assert rest.endswith(b"\r\n\r\n" + b"x" * 10)
        assert gateway.by_callbacks == 1
        assert gateway.handed_back == 0
        await closed(writer)


async def test_a_crawler_that_stops_reading_pauses_the_proxy_and_is_let_go() -> None:
    proxy_blocked = asyncio.Event()
    proxy_ended = asyncio.Event()
    big = 64 << 20

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % big)
        try:
            for _ in range(big >> 20):
                writer.write(b"y" * (1 << 20))
                try:
                    await asyncio.wait_for(writer.drain(), 0.2)
                except TimeoutError:
                    proxy_blocked.set()  # the gateway stopped reading this connection
                    await writer.drain()
        finally:
            proxy_ended.set()

    async with setup([ok, flood]) as (gateway, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
        writer.write(get("first"))
        await answered(reader)
        writer.write(get("big"))  # and never read
        await asyncio.wait_for(proxy_blocked.wait(), 5)
        await asyncio.wait_for(proxy_ended.wait(), 5)  # the idle bound closed the proxy's side
        received = 0
        with contextlib.suppress(OSError):
            while chunk := await asyncio.wait_for(reader.read(1 << 20), 5):
                received += len(chunk)
        assert 0 < received < big // 4  # paused, not buffered whole in the gateway
        assert gateway.by_callbacks == 1  # counted as what it moved, as the coroutine counts
        await closed(writer)


async def test_a_proxy_that_does_not_answer_in_time_is_handed_to_the_coroutine() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the gateway gives up on it

    async with setup([ok, silent]) as (gateway, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(get("first"))
        await answered(reader)
        writer.write(get("silent"))
        answer = await asyncio.wait_for(reader.read(), 5)
        # Retried once through another proxy, as the coroutine does; there is none here.
        assert answer.startswith((b"HTTP/1.1 502", b"HTTP/1.1 503")), answer
        assert gateway.handed_back == 1
        assert gateway.by_callbacks == 0
        await closed(writer)
