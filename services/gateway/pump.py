"""A CONNECT tunnel's bytes, copied by the connections' own protocols (docs/gateway.md, "How a
request goes"; docs/benchmarks.md, "The gateway").

Once a tunnel is open the gateway has nothing to read in it (no TLS interception), so its two
connections are handed from their streams to a pair of protocols that write what arrives on one
side to the other at once: no task, no future and no timeout per chunk. A loop of awaited reads
cost 0.8 to 1.0 ms of CPU per MB and half the direct tunnel's bytes per second on two cores; the
bare relay that ``bench.relay_floor`` measures, built like this, costs 0.67 ms.

Flow control is the transports': a side whose write buffer is full pauses the reading of the
other. The end is TCP's: an end of file is passed on as a half-close, and the tunnel ends when
both directions have ended or either connection is lost. Every byte moved, either way, counts as
activity; a tunnel where nothing moves for ``idle_timeout`` is aborted (a side that stops
reading holds it no longer than one that stops sending).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

UP, DOWN = 0, 1
"""Directions: from the crawler to the proxy, and back."""


class _Side(asyncio.Protocol):
    """One connection of the tunnel: ``UP`` is the crawler's (its bytes go up), ``DOWN`` the
    proxy's. The stream protocol it replaced still hears of the connection's end, so whoever
    waits on the stream's ``wait_closed`` is told."""

    def __init__(self, tunnel: Tunnel, direction: int, replaced: asyncio.BaseProtocol) -> None:
        self.tunnel = tunnel
        self.direction = direction
        self.replaced = replaced

    def data_received(self, data: bytes) -> None:
        self.tunnel.moved(self.direction, data)

    def eof_received(self) -> bool:
        self.tunnel.ended(self.direction)
        return True  # half-closed: the other direction may go on

    def pause_writing(self) -> None:
        self.tunnel.source_of(self.direction).pause_reading()

    def resume_writing(self) -> None:
        self.tunnel.source_of(self.direction).resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.tunnel.lost()
        self.replaced.connection_lost(exc)


class Tunnel:
    """Bytes copied between ``crawler`` and ``proxy`` until both directions end, either
    connection is lost, or nothing moves for ``idle_timeout``; ``counts`` holds the bytes moved
    up and down."""

    def __init__(
        self, crawler: asyncio.Transport, proxy: asyncio.Transport, idle_timeout: float
    ) -> None:
        self.transports = (crawler, proxy)
        self.counts = [0, 0]
        self.idle_timeout = idle_timeout
        self._loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self._loop.create_future()
        self._ended = [False, False]
        self._active = True
        self._timer = self._loop.call_later(idle_timeout, self._idle)

    def source_of(self, direction: int) -> asyncio.Transport:
        """The transport whose bytes are written to the ``direction`` side's connection."""
        return self.transports[1 - direction]

    def moved(self, direction: int, data: bytes) -> None:
        self.counts[direction] += len(data)
        self._active = True
        self.transports[1 - direction].write(data)

    def ended(self, direction: int) -> None:
        """The ``direction`` side sent its last byte: the other side is told (a half-close)."""
        self._ended[direction] = True
        peer = self.transports[1 - direction]
        if peer.can_write_eof() and not peer.is_closing():
            peer.write_eof()
        if all(self._ended):
            self._finish()

    def lost(self) -> None:
        self._finish()

    def _idle(self) -> None:
        if self.done.done():
            return
        if self._active:
            self._active = False
            self._timer = self._loop.call_later(self.idle_timeout, self._idle)
            return
        for transport in self.transports:
            transport.abort()
        self._finish()

    def _finish(self) -> None:
        if self.done.done():
            return
        self._timer.cancel()
        for transport in self.transports:
            transport.close()
        self.done.set_result(None)


def _buffered(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """What the stream had read and not handed out yet, and whether it had seen the end of file.
    A crawler may send its first bytes (a TLS hello) before the tunnel's 200 reaches it, and a
    server may speak first: those bytes are in the stream's buffer, not in the socket."""
    state = cast(Any, reader)  # the buffer is the stream's own; no public call hands it over
    data = bytes(state._buffer)
    state._buffer.clear()
    return data, bool(state._eof)


Side = tuple[asyncio.Transport, bytes, bool]
"""A connection handed to a tunnel: its transport, what was read from it and not handed out
yet, and whether its end of file was seen."""


def stream_side(streams: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> Side:
    return (cast(asyncio.Transport, streams[1].transport), *_buffered(streams[0]))


async def pump(
    crawler: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    proxy: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    idle_timeout: float,
) -> tuple[int, int]:
    """Copy between the two connections, held as streams, until the tunnel ends; the bytes
    moved up and down. Both connections are closed when it returns."""
    return await pump_sides(stream_side(crawler), stream_side(proxy), idle_timeout)


async def pump_sides(crawler: Side, proxy: Side, idle_timeout: float) -> tuple[int, int]:
    """``pump`` for connections however they were read until now."""
    transports = (crawler[0], proxy[0])
    tunnel = Tunnel(*transports, idle_timeout)
    for direction, transport in enumerate(transports):
        transport.set_protocol(_Side(tunnel, direction, transport.get_protocol()))
        if not transport.is_reading() and not transport.is_closing():
            transport.resume_reading()  # its reader had paused it, its buffer full
    for direction, (_, data, eof) in enumerate((crawler, proxy)):
        if data:
            tunnel.moved(direction, data)
        if eof:
            tunnel.ended(direction)
    if any(transport.is_closing() for transport in transports):
        tunnel.lost()  # gone before the hand-over: its end was told to the reader, not to us
    try:
        await tunnel.done
    finally:
        tunnel.lost()
    return tunnel.counts[UP], tunnel.counts[DOWN]
