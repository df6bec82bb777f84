"""A connection to a leased proxy for plain requests, read by its own protocol (docs/gateway.md,
"How a request goes").

The proxy's answer is parsed as it arrives, in ``data_received``: the head is kept until it is
whole and handed to the request's coroutine, which decides (``pure.outcomes``) whether the
crawler gets it; the rest of the body is then written to the crawler's transport from
``data_received`` itself, with no task, future or timeout per chunk. The crawler's write buffer
is the flow control: when it is over its high-water mark, reading from the proxy pauses and the
request's coroutine waits for the crawler to drain (``idle_timeout``, like any wait).

Every wait on the proxy (its answer within ``answer_timeout``, each byte of the rest within
``idle_timeout``) is one deadline per connection: a single timer that moves with the deadline
only when it fires early, so that a request costs a float stored, not a timer made and
cancelled (docs/decisions/0156-the-gateway-s-edges.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

from services.gateway.bounds import Sink
from services.gateway.pure.heads import HeadError
from services.gateway.reading import MAX_HEAD, Response


class UpstreamError(Exception):
    """The leased proxy could not be reached, or answered nothing usable."""


PAUSED = object()
"""What the relay is woken with when the crawler's write buffer is full."""
_IDLE, _HEAD, _HELD, _RELAY, _OVER = range(5)
"""A connection's phases: no request; the answer's head awaited; the head whole, the rest held
back until the verdict; the rest passed on; the answer whole (or failed), nothing more expected.
"""


class Upstream(asyncio.Protocol):
    """One connection to a proxy, one request at a time: ``send``, ``answer`` (the head),
    ``relay`` (the rest, straight to the crawler). Between requests it waits in ``Upstreams``;
    a byte or an end of file from the proxy meanwhile makes it unusable."""

    def __init__(self, forget: Callable[[], None]) -> None:
        self._forget = forget
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.busy = False
        self.lost = False
        self.counted = False
        """Counted in its pool's open connections (told when it is lost)."""
        self._phase = _IDLE
        self._early = bytearray()
        self.response = Response(head_only=False)
        self.seen = bytearray()
        """The answer's bytes up to its head's end, and what came with them."""
        self.down = 0
        """Bytes of the answer passed on to the crawler after ``seen``."""
        self._client: asyncio.Transport | None = None
        self._high = 0
        self._loop = asyncio.get_running_loop()
        self._deadline = 0.0
        self._idle = 0.0
        self._crawler_full = False
        self._timer: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Future[object] | None = None
        self._outcomes: list[object] = []
        """What happened while nobody waited, in order."""
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self.on_event: Callable[[object], None] | None = None
        """Told what happens instead of a waiting coroutine: the callbacks' path
        (``fast.Lane``), which judges an answer's head where it arrives, so reading goes on."""

    # ------------------------------------------------------------------ the request's side

    def send(self, data: bytes, *, head_only: bool) -> None:
        """Start a request: its head (and body, when kept) written, the answer awaited next."""
        self.busy = True
        self.response = Response(head_only)
        self.seen = bytearray()
        self.down = 0
        self._client = None
        self._outcomes.clear()
        self._phase = _HEAD
        self.write(data)

    def write(self, data: bytes) -> None:
        if self.transport is None or self.closed:
            raise UpstreamError("the proxy closed the connection")
        self.transport.write(data)

    async def drain(self, timeout: float) -> None:
        """Until the proxy takes what was written (a large body), within ``timeout``."""
        if self.closed:
            raise UpstreamError("the proxy closed the connection")
        if not self._write_paused:
            return
        self._drained = self._loop.create_future()
        async with asyncio.timeout(timeout):
            await self._drained

    async def answer(self, timeout: float) -> tuple[Response, bytes]:
        """The answer's head, within ``timeout`` of now, and the bytes read so far."""
        self._arm(timeout)
        await self._wait()
        return self.response, bytes(self.seen)

    async def relay(self, writer: Sink, idle_timeout: float) -> bool:
        """Pass the rest of the answer to the crawler; whether it ended as its framing says
        (the connection may then be kept). A byte must move every ``idle_timeout``, either from
        the proxy or out of the crawler's full buffer."""
        self.begin_relay(cast(asyncio.Transport, writer.transport), idle_timeout)
        if self.closed and not self._outcomes:
            return False
        self.resume()
        while True:
            state = await self._wait()
            if state is not PAUSED:
                return bool(state)
            try:
                async with asyncio.timeout(idle_timeout):
                    await writer.drain()
            except TimeoutError:
                return False
            self._arm(idle_timeout)
            self.resume()

    def begin_relay(self, client: asyncio.Transport, idle_timeout: float) -> None:
        """From now on the rest of the answer goes to ``client`` as it arrives, what came
        while it was held first."""
        self._client = client
        self._high = client.get_write_buffer_limits()[1]
        self._arm(idle_timeout)
        self._outcomes.clear()  # an end or a deadline while held: judged after what came
        self._phase = _RELAY
        if self._early:
            early, self._early = bytes(self._early), bytearray()
            self._pass(early)

    def hold(self) -> None:
        """Handed from the callbacks' path to a coroutine: the rest waits for its verdict."""
        self.on_event = None
        if self._phase == _HELD and self.transport is not None:
            self.transport.pause_reading()

    @property
    def reusable(self) -> bool:
        """Whether the answer ended as framed and nothing came after it."""
        return not self.closed and self.response.complete and not self._early

    def done(self) -> None:
        """The request is over: the connection waits for the next one."""
        self.busy = False
        self._client = None
        self._phase = _IDLE

    def close(self) -> None:
        self.busy = False
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------------ the protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def data_received(self, data: bytes) -> None:
        phase = self._phase
        if phase == _RELAY:
            self._pass(data)
        elif phase == _HEAD:
            self._head(data)
        elif phase == _HELD:
            self._early += data  # what came before reading paused, passed on by ``relay``
        else:
            self.close()  # nothing was asked, or the answer was whole: not to be trusted again

    def _head(self, data: bytes) -> None:
        response = self.response
        self.seen += data
        try:
            response.feed(data)
        except HeadError as exc:
            self._phase = _OVER
            self._wake(exc)
            return
        if response.headers_done:
            if response.complete:
                self._phase = _OVER
            else:
                self._phase = _HELD
                if self.transport is not None and self.on_event is None:
                    self.transport.pause_reading()  # the rest waits for the verdict
            self._wake(None)
        elif len(self.seen) > MAX_HEAD * 4:
            self._phase = _OVER
            self._wake(UpstreamError("the proxy's answer head is too long"))

    def _pass(self, data: bytes) -> None:
        client = self._client
        assert client is not None
        if client.is_closing():
            self._phase = _OVER
            self._wake(ConnectionResetError("the crawler closed its connection"))
            return
        self.down += len(data)
        client.write(data)
        self._deadline = self._loop.time() + self._idle
        try:
            self.response.feed(data)
        except HeadError as exc:
            self._phase = _OVER
            self._wake(exc)
            return
        if self.response.complete:
            self._phase = _OVER
            self._wake(True)
        elif client.get_write_buffer_size() > self._high and self.transport is not None:
            self.transport.pause_reading()
            self._crawler_full = True
            self._wake(PAUSED)

    def eof_received(self) -> bool:
        self.closed = True
        self._ended()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = self.lost = True
        self._ended()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(UpstreamError("the proxy closed the connection"))
        if self.counted:
            self.counted = False
            self._forget()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # ------------------------------------------------------------------ helpers

    def _ended(self) -> None:
        if not self.busy or self._phase == _OVER:
            return
        if self._phase == _HEAD:
            self._wake(UpstreamError("the proxy closed the connection before answering"))
        else:
            self._wake(False)

    def resume(self) -> None:
        self._crawler_full = False
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def arm(self, timeout: float) -> None:
        """The next event due within ``timeout`` of now (the answer's head, a byte)."""
        self._arm(timeout)

    def _arm(self, timeout: float) -> None:
        self._idle = timeout
        self._deadline = self._loop.time() + timeout
        if self._timer is None:
            self._timer = self._loop.call_at(self._deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if not self.busy or self.closed or self._phase == _OVER:
            return
        if self._crawler_full and self.on_event is None:
            self._deadline = self._loop.time() + self._idle  # the crawler's drain has its bound
        if self._loop.time() < self._deadline:
            self._timer = self._loop.call_at(self._deadline, self._expire)
            return
        if self._phase == _HEAD:
            self._wake(TimeoutError())
        else:
            self._wake(False)

    def _wake(self, outcome: object) -> None:
        if self.on_event is not None:
            self.on_event(outcome)
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if isinstance(outcome, BaseException):
                waiter.set_exception(outcome)
            else:
                waiter.set_result(outcome)
        else:
            self._outcomes.append(outcome)

    async def _wait(self) -> object:
        if not self._outcomes:
            self._waiter = self._loop.create_future()
            try:
                return await self._waiter
            finally:
                self._waiter = None
        outcome = self._outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
