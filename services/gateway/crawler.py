"""A crawler's connection to the gateway, read by its own protocol (docs/gateway.md, "How a
request goes"; docs/decisions/0156-the-gateway-s-edges.md).

What the crawler sends is kept in one buffer; a request head is taken from it as soon as it is
whole (``reading.take_head``: a bare LF refused at once, blank lines skipped, ``MAX_HEAD``
bounded), in ``data_received``, and handed to the connection's task, which answers it
(``server.Gateway``). Each wait (the next head, a request body, room in the crawler's write
buffer) has a bound, held by one deadline per connection: a single timer that moves only when it
fires early, not a timer made and cancelled per request. The buffer is bounded too: past
``MAX_BUFFER`` reading pauses until the task takes what it needs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any, cast

from services.gateway.reading import take_head

MAX_BUFFER = 256 * 1024
"""Bytes read ahead of the task (a pipelined request, a body on its way) before reading
pauses."""


class Crawler(asyncio.Protocol):
    """One crawler connection: ``head``, ``read``/``readexactly`` for a body, ``write`` and
    ``drain`` for the answer; ``serve`` is the task that answers it."""

    def __init__(self, serve: Callable[[Crawler], Coroutine[Any, Any, None]]) -> None:
        self._serve = serve
        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        self.buffer = bytearray()
        self.eof = False
        self.lost = False
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._reading_paused = False
        self.task: asyncio.Task[None] | None = None
        self.fast: Callable[[], bool] | None = None
        """Tried when a head arrives while the task waits for one: whether it took what there
        was (``fast.Lane``: a request answered from callbacks), so the task need not wake."""
        self.busy = False
        """A request is being answered from callbacks: the task's wait for a head goes on."""
        self.resume: Coroutine[Any, Any, bool] | None = None
        """What the callbacks handed back to the task, to run as its next request."""
        self.ended = False
        """The callbacks answered a request after which the connection ends."""
        self.served = 0
        """Requests the callbacks answered."""
        self.on_drained: Callable[[], None] | None = None
        """Told when the crawler's write buffer has room again."""
        self._parked = False

    # ------------------------------------------------------------------ the protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        self.task = self._loop.create_task(self._serve(self))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > MAX_BUFFER and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        if self._parked and not self.busy and self.fast is not None and self.fast():
            return
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return True  # half-closed: the answer may still go out

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = self.lost = True
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self.on_drained is not None:
            self.on_drained()

    @property
    def writing_paused(self) -> bool:
        return self._write_paused

    @property
    def parked(self) -> bool:
        """Whether the task waits for the next head (and for nothing else)."""
        return self._parked

    # ------------------------------------------------------------------ reading

    async def head(self, timeout: float) -> bytes:
        """The next request head's bytes; ``b""`` when the crawler closed between requests.
        ``HeadError`` for a head the gateway will not read, ``TimeoutError`` after
        ``timeout``. ``b""`` too when the callbacks handed a request back (``resume``) or
        ended the connection (``ended``); never while they answer one (``busy``)."""
        self._arm(timeout)
        while True:
            if not self.busy:
                if self.resume is not None or self.ended:
                    return b""
                head = take_head(self.buffer, eof=self.eof)
                if head is not None:
                    self._took()
                    return head
            self._parked = True
            try:
                await self._wait()
            finally:
                self._parked = False

    async def readexactly(self, n: int, timeout: float) -> bytes:
        """``n`` bytes of a body, each within ``timeout`` of the one before."""
        self._arm(timeout)
        while len(self.buffer) < n:
            if self.eof:
                raise asyncio.IncompleteReadError(bytes(self.buffer), n)
            seen = len(self.buffer)
            self._resume_reading()
            await self._wait()
            if len(self.buffer) > seen:
                self._arm(timeout)
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        self._took()
        return data

    async def read(self, n: int, timeout: float) -> bytes:
        """Up to ``n`` bytes, at least one unless the crawler ended (``b""``), within
        ``timeout``."""
        self._arm(timeout)
        while not self.buffer and not self.eof:
            await self._wait()
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        self._took()
        return data

    def take_buffer(self) -> bytes:
        """What was read and not taken: the first bytes of a tunnel."""
        data = bytes(self.buffer)
        self.buffer.clear()
        return data

    # ------------------------------------------------------------------ writing

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    async def drain(self) -> None:
        """Until the crawler's write buffer is below its mark; ``ConnectionResetError`` once
        the connection is lost (a crawler that left mid-answer)."""
        if self.lost:
            raise ConnectionResetError("the crawler closed its connection")
        if not self._write_paused:
            return
        self._drained = self._loop.create_future()
        await self._drained
        if self.lost:
            raise ConnectionResetError("the crawler closed its connection")

    def close(self, timeout: float) -> None:
        """Close; what it still has to send gets ``timeout`` seconds, then the connection is
        reset. A plain close waits for the peer to take the rest, for ever if it never reads,
        and holds the descriptor meanwhile."""
        self.transport.close()
        if self.transport.get_write_buffer_size():
            self._loop.call_later(timeout, self.transport.abort)

    async def linger(self, answer: bytes, seconds: float, most: int) -> None:
        """Write ``answer``, end the gateway's side, and drop what the crawler still sends for
        at most ``seconds`` and ``most`` bytes: closing a socket with unread bytes resets it,
        and a reset can overtake the answer on its way to the crawler."""
        with contextlib.suppress(OSError, TimeoutError, RuntimeError):
            async with asyncio.timeout(seconds):
                self.write(answer)
                await self.drain()
                if self.transport.can_write_eof() and not self.transport.is_closing():
                    self.transport.write_eof()
                left = most
                while left > 0:
                    left -= len(self.buffer)
                    self.buffer.clear()
                    self._resume_reading()
                    if self.eof:
                        return
                    self._deadline = self._loop.time() + seconds  # the outer bound holds
                    await self._wait()

    # ------------------------------------------------------------------ for the callbacks

    def rearm(self, timeout: float) -> None:
        """The wait for the next head is due ``timeout`` from now (a request was answered)."""
        self._deadline = self._loop.time() + timeout

    def wake(self) -> None:
        """The task looks again: a request handed back, an end, a head to read."""
        self._wake()

    def took(self) -> None:
        self._took()

    # ------------------------------------------------------------------ helpers

    def _took(self) -> None:
        if self._reading_paused and len(self.buffer) <= MAX_BUFFER // 2:
            self._resume_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused:
            self._reading_paused = False
            if not self.lost:
                self.transport.resume_reading()

    def _arm(self, timeout: float) -> None:
        self._deadline = self._loop.time() + timeout
        if self._timer is None and not self.lost:
            self._timer = self._loop.call_at(self._deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self._waiter is None or self._waiter.done():
            return  # nobody waits: the next wait arms again
        if self.busy:  # a request answered from callbacks, with deadlines of its own
            self._deadline = max(self._deadline, self._loop.time() + 1.0)
        if self._loop.time() < self._deadline:
            self._timer = self._loop.call_at(self._deadline, self._expire)
            return
        self._waiter.set_exception(TimeoutError())

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        if self._timer is None and not self.lost:
            self._timer = self._loop.call_at(self._deadline, self._expire)
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
