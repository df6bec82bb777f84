"""A crawler's connection (``Crawler``) on real sockets: pipelined heads and bodies sent a byte
at a time are taken whole and in order; a crawler that sends without end is paused, not
buffered; a head that does not come is a ``TimeoutError``; a refusal is read by the crawler."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from services.gateway.crawler import MAX_BUFFER, Crawler
from services.gateway.reading import parse_request

pytestmark = pytest.mark.integration

Serve = Callable[[Crawler], Coroutine[Any, Any, None]]


@contextlib.asynccontextmanager
async def listening(serve: Serve) -> AsyncIterator[int]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Crawler(serve), "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return reader, writer


async def test_pipelined_heads_and_bodies_sent_a_byte_at_a_time_are_taken_whole() -> None:
    first = b"POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n\r\n"
    second = b"\r\nGET http://b.test/x HTTP/1.1\r\nHost: b.test\r\n\r\n"
    taken: list[bytes] = []
    ended = asyncio.Event()

    async def serve(crawler: Crawler) -> None:
        try:
            while head := await crawler.head(5.0):
                taken.append(head)
                request = parse_request(head)
                if request.length:
                    taken.append(await crawler.readexactly(request.length, 5.0))
                crawler.write(b"ok\n")
        finally:
            ended.set()
            crawler.close(1.0)

    async with listening(serve) as port:
        reader, writer = await _connect(port)
        for byte in first + b"hello" + second:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.001)
        assert await asyncio.wait_for(reader.readexactly(6), 5) == b"ok\nok\n"
        writer.write_eof()
        await asyncio.wait_for(ended.wait(), 5)
        writer.close()
    assert taken == [first, b"hello", second[2:]]


async def test_a_crawler_that_sends_without_end_is_paused_not_buffered() -> None:
    held: list[Crawler] = []
    release = asyncio.Event()

    async def serve(crawler: Crawler) -> None:
        held.append(crawler)
        await release.wait()  # busy elsewhere: nothing is taken from the buffer
        crawler.close(1.0)

    async with listening(serve) as port:
        _, writer = await _connect(port)

        async def flood() -> None:
            with contextlib.suppress(OSError):
                while True:
                    writer.write(b"x" * 65536)
                    await writer.drain()

        flooding = asyncio.create_task(flood())
        await asyncio.sleep(1.0)
        try:
            assert held
            buffered = len(held[0].buffer)
            assert MAX_BUFFER < buffered <= MAX_BUFFER + 256 * 1024
            await asyncio.sleep(0.5)
            assert len(held[0].buffer) == buffered  # reading paused: nothing more came in
        finally:
            flooding.cancel()
            release.set()
            writer.close()


async def test_a_head_that_does_not_come_is_a_timeout_and_a_refusal_reaches_the_crawler() -> None:
    outcome: list[object] = []

    async def serve(crawler: Crawler) -> None:
        try:
            await crawler.head(0.3)
        except TimeoutError as exc:
            outcome.append(exc)
            await crawler.linger(b"HTTP/1.1 408 Request Timeout\r\n\r\n", 2.0, 1024)
        finally:
            crawler.close(1.0)

    async with listening(serve) as port:
        reader, writer = await _connect(port)
        writer.write(b"GET http://a.test/ HTTP/1.1\r\nHost: a")
        answer = await asyncio.wait_for(reader.read(), 5)  # the answer, then the end
        writer.close()
    assert answer == b"HTTP/1.1 408 Request Timeout\r\n\r\n"
    assert len(outcome) == 1
