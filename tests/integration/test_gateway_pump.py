"""The tunnel pump on real sockets: the bytes both ways, counted exactly; half-closes passed on;
what the streams had buffered before the hand-over; flow control; the idle bound."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from services.gateway.pump import pump

pytestmark = pytest.mark.integration

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class Pair:
    """A connection as the gateway holds it (``ours``) and its far end (``theirs``)."""

    ours: Stream
    theirs: Stream


@contextlib.asynccontextmanager
async def pair() -> AsyncIterator[Pair]:
    accepted: asyncio.Queue[Stream] = asyncio.Queue()

    async def on_accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put((reader, writer))

    server = await asyncio.start_server(on_accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        theirs = await asyncio.open_connection("127.0.0.1", port)
        ours = await accepted.get()
        try:
            yield Pair(ours, theirs)
        finally:
            for _, writer in (ours, theirs):
                writer.close()


async def test_bytes_cross_both_ways_counted_and_half_closes_are_passed_on() -> None:
    async with pair() as crawler, pair() as proxy:
        running = asyncio.create_task(pump(crawler.ours, proxy.ours, idle_timeout=10))
        crawler.theirs[1].write(b"hello up" * 1000)
        proxy.theirs[1].write(b"hello down" * 3000)
        assert await proxy.theirs[0].readexactly(8000) == b"hello up" * 1000
        assert await crawler.theirs[0].readexactly(30000) == b"hello down" * 3000
        crawler.theirs[1].write_eof()  # the crawler is done sending; the answer goes on
        assert await proxy.theirs[0].read() == b""
        proxy.theirs[1].write(b"the rest")
        assert await crawler.theirs[0].readexactly(8) == b"the rest"
        proxy.theirs[1].write_eof()
        assert await crawler.theirs[0].read() == b""
        assert await asyncio.wait_for(running, 10) == (8000, 30008)


async def test_bytes_the_streams_held_before_the_hand_over_are_not_lost() -> None:
    """A crawler that sends its TLS hello before the tunnel's 200 reached it, a server that
    speaks first: those bytes were read into the streams already."""
    async with pair() as crawler, pair() as proxy:
        crawler.theirs[1].write(b"early hello")
        proxy.theirs[1].write(b"server speaks first")
        await asyncio.sleep(0.2)  # let them land in the streams' buffers
        running = asyncio.create_task(pump(crawler.ours, proxy.ours, idle_timeout=10))
        assert await proxy.theirs[0].readexactly(11) == b"early hello"
        assert await crawler.theirs[0].readexactly(19) == b"server speaks first"
        crawler.theirs[1].close()
        assert await proxy.theirs[0].read() == b""  # passed on as the end of what goes up
        proxy.theirs[1].close()
        assert await asyncio.wait_for(running, 10) == (11, 19)


async def test_a_tunnel_where_nothing_moves_ends_after_the_idle_timeout() -> None:
    async with pair() as crawler, pair() as proxy:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await asyncio.wait_for(pump(crawler.ours, proxy.ours, idle_timeout=0.5), 10) == (
            0,
            0,
        )
        assert loop.time() - started >= 0.5
        assert await crawler.theirs[0].read() == b""  # both ends let go
        assert await proxy.theirs[0].read() == b""


async def test_a_crawler_that_stops_reading_pauses_the_proxy_and_is_let_go() -> None:
    """The proxy floods, the crawler reads nothing: the gateway holds a bounded buffer (the
    proxy's reading is paused), and once nothing moves for the idle timeout, both go."""
    async with pair() as crawler, pair() as proxy:
        flood = asyncio.create_task(_flood(proxy.theirs[1]))
        try:
            running = asyncio.create_task(pump(crawler.ours, proxy.ours, idle_timeout=1.0))
            await asyncio.sleep(0.5)
            held = crawler.ours[1].transport.get_write_buffer_size()
            assert held < 4 * 1024 * 1024, held
            up, down = await asyncio.wait_for(running, 15)
            assert (up, down > 0) == (0, True)
        finally:
            flood.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flood


async def test_a_lost_connection_ends_the_tunnel_and_closes_the_other() -> None:
    async with pair() as crawler, pair() as proxy:
        running = asyncio.create_task(pump(crawler.ours, proxy.ours, idle_timeout=10))
        crawler.theirs[1].write(b"x")
        assert await proxy.theirs[0].readexactly(1) == b"x"
        sock = proxy.theirs[1].get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        proxy.theirs[1].transport.abort()  # the proxy resets (RST, not an end of file)
        assert await asyncio.wait_for(running, 10) == (1, 0)
        with contextlib.suppress(ConnectionResetError):  # an end or a reset: either ends it
            assert await asyncio.wait_for(crawler.theirs[0].read(), 10) == b""
        with contextlib.suppress(ConnectionResetError):
            await asyncio.wait_for(proxy.ours[1].wait_closed(), 10)  # the stream is told too


async def _flood(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while True:
            writer.write(b"z" * 65536)
            await writer.drain()
