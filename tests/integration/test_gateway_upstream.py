"""A plain request's connection to the proxy (``Upstream``) on real sockets: an answer split at
every byte boundary reaches the crawler whole and counted to the byte; a crawler that stops
reading pauses the proxy's side and is let go after the idle bound; the proxy's ends, stray bytes
and silences are told apart."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest

from services.gateway.relay import Upstreams
from services.gateway.upstream import Upstream, UpstreamError

pytestmark = pytest.mark.integration

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]

HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX-Site: yes\r\n\r\n"
FIXED = HEAD + b"hello, world"
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n"
)
REQUEST = b"GET http://site.test/ HTTP/1.1\r\nHost: site.test\r\n\r\n"


@contextlib.asynccontextmanager
async def proxy() -> AsyncIterator[tuple[int, asyncio.Queue[Stream]]]:
    """A listening socket standing for the proxy: each accepted connection is queued."""
    accepted: asyncio.Queue[Stream] = asyncio.Queue()
    writers: list[asyncio.StreamWriter] = []

    async def on_accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.get_extra_info("socket").setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
        )
        writers.append(writer)
        await accepted.put((reader, writer))

    server = await asyncio.start_server(on_accept, "127.0.0.1", 0)
    async with server:
        try:
            yield server.sockets[0].getsockname()[1], accepted
        finally:
            for writer in writers:
                writer.close()
            await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def crawler() -> AsyncIterator[tuple[Stream, Stream]]:
    """A connection as the gateway holds its crawler's (first) and the crawler's end."""
    accepted: asyncio.Queue[Stream] = asyncio.Queue()

    async def on_accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put((reader, writer))

    server = await asyncio.start_server(on_accept, "127.0.0.1", 0)
    async with server:
        theirs = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        ours = await accepted.get()
        try:
            yield ours, theirs
        finally:
            ours[1].close()
            theirs[1].close()


async def _exchange(
    upstreams: Upstreams,
    port: int,
    far: list[Stream],
    accepted: asyncio.Queue[Stream],
    *,
    cut: int,
    answer: bytes,
) -> tuple[Upstream, bytes, int, bool]:
    """One request whose answer the proxy sends in two writes, cut at ``cut``; the connection,
    what the crawler received, what was counted, and whether the answer ended as framed."""
    up = await upstreams.take("127.0.0.1", port)
    up.send(REQUEST, head_only=False)
    if not far:
        far.append(await accepted.get())
    far_reader, far_writer = far[0]
    assert await far_reader.readexactly(len(REQUEST)) == REQUEST
    far_writer.write(answer[:cut])
    await far_writer.drain()
    await asyncio.sleep(0.002)  # two segments, two reads, as far as the loop lets us
    far_writer.write(answer[cut:])
    async with crawler() as (ours, theirs):
        response, seen = await up.answer(5.0)
        ours[1].write(seen)
        whole = response.complete or await up.relay(ours[1], 5.0)
        counted = len(seen) + up.down
        got = await asyncio.wait_for(theirs[0].readexactly(len(answer)), 5)
    return up, got, counted, whole


@pytest.mark.parametrize("answer", [FIXED, CHUNKED], ids=["content-length", "chunked"])
async def test_an_answer_cut_at_every_byte_reaches_the_crawler_whole_and_counted(
    answer: bytes,
) -> None:
    async with proxy() as (port, accepted):
        upstreams = Upstreams(connect_timeout=5.0)
        far: list[Stream] = []
        for cut in range(1, len(answer)):
            up, got, counted, whole = await _exchange(
                upstreams, port, far, accepted, cut=cut, answer=answer
            )
            assert got == answer, cut
            assert counted == len(answer), cut
            assert whole, cut
            assert up.response.status == 200
            upstreams.give_back("127.0.0.1", port, up)
        assert upstreams.open_now == 1  # one connection, kept and used for every request
        upstreams.close()


async def test_a_crawler_that_stops_reading_pauses_the_proxy_and_is_let_go() -> None:
    async with proxy() as (port, accepted), crawler() as (ours, theirs):
        upstreams = Upstreams(connect_timeout=5.0)
        up = await upstreams.take("127.0.0.1", port)
        up.send(REQUEST, head_only=False)
        _, far_writer = await accepted.get()
        far_writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
        response, _ = await up.answer(5.0)
        assert response.headers_done
        assert not response.complete

        async def flood() -> None:
            with contextlib.suppress(OSError):
                while True:
                    far_writer.write(b"x" * 65536)
                    await far_writer.drain()

        flooding = asyncio.create_task(flood())
        try:
            whole = await asyncio.wait_for(up.relay(ours[1], 0.5), 10)
        finally:
            flooding.cancel()
        assert not whole
        # Paused, not buffered without end: the crawler's buffer stopped near its mark.
        high = ours[1].transport.get_write_buffer_limits()[1]
        assert ours[1].transport.get_write_buffer_size() <= high + 4 * 65536
        assert up.down > 0
        assert not up.reusable
        up.close()
        del theirs


async def test_the_proxys_end_silence_and_stray_bytes_are_told_apart() -> None:
    async with proxy() as (port, accepted):
        upstreams = Upstreams(connect_timeout=5.0)
        # Closed before answering: an UpstreamError (the request may go again).
        up = await upstreams.take("127.0.0.1", port)
        up.send(REQUEST, head_only=False)
        _, far_writer = await accepted.get()
        far_writer.close()
        with pytest.raises(UpstreamError):
            await up.answer(5.0)
        # Silent: the answer's deadline.
        up = await upstreams.take("127.0.0.1", port)
        up.send(REQUEST, head_only=False)
        far = await accepted.get()
        with pytest.raises(TimeoutError):
            await up.answer(0.3)
        up.close()
        far[1].close()
        # Closed mid-body: not whole, and not kept.
        up = await upstreams.take("127.0.0.1", port)
        up.send(REQUEST, head_only=False)
        _, far_writer = await accepted.get()
        far_writer.write(HEAD + b"hello")
        async with crawler() as (ours, _):
            response, seen = await up.answer(5.0)
            await asyncio.sleep(0.1)
            far_writer.close()
            assert not await up.relay(ours[1], 5.0)
            assert len(seen) + up.down == len(HEAD) + 5
        assert not up.reusable
        up.close()
        # A byte from an idle kept connection: it is closed, and the next request gets another.
        up = await upstreams.take("127.0.0.1", port)
        up.send(REQUEST, head_only=False)
        _, far_writer = await accepted.get()
        far_writer.write(FIXED)
        response, _ = await up.answer(5.0)
        assert response.complete
        upstreams.give_back("127.0.0.1", port, up)
        far_writer.write(b"HTTP/1.1 200 OK\r\n")  # nobody asked
        await asyncio.sleep(0.1)
        again = await upstreams.take("127.0.0.1", port)
        assert again is not up
        again.close()
        upstreams.close()
        await asyncio.sleep(0.05)
        assert upstreams.open_now == 0
