"""One write per response, not two (docs/benchmarks.md, Discovery API).

uvicorn writes a response's head when the app sends ``http.response.start`` and its body when
the app sends ``http.response.body``: two ``send`` system calls, and two wake-ups of the client,
for every answer of a few hundred bytes. On a loopback each costs about as much as a page of
our own code, so a lease cycle (two requests) paid for four writes where two do.

``Corked`` stands between the protocol and its transport and holds one write back: the next
write goes out joined to it, at once. The app sends the body right after the head, with nothing
awaited between, so a response leaves whole and no later than before. A held write that nothing
follows (a streamed response between two chunks) leaves on the event loop's next turn, and
closing the transport writes what is held first.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast


class Corked:
    """A transport's stand-in that joins each write to the one after it."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        held = self._held
        if held is None:
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return
        self._held = None
        self._transport.write(held + bytes(data))

    def writelines(self, lines: Any) -> None:
        self.write(b"".join(lines))

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def get_write_buffer_size(self) -> int:
        held = self._held
        return self._transport.get_write_buffer_size() + (len(held) if held else 0)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Cork:
    """Mixed in ahead of a uvicorn HTTP protocol: it gets a ``Corked`` transport."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        corked = Corked(cast(asyncio.Transport, transport), asyncio.get_running_loop())
        super().connection_made(corked)  # type: ignore[misc] # the protocol next in the MRO


def corked(protocol: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """``protocol`` (a uvicorn HTTP protocol class) writing each response at once."""
    return type(f"Corked{protocol.__name__}", (_Cork, protocol), {})
