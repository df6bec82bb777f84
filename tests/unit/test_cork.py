"""``Corked``: each write leaves joined to the next one, or on the loop's next turn, never
lost and never reordered (services/discovery/http/cork.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from services.discovery.http.cork import Corked, corked


class Recording(asyncio.Transport):
    """What reached the socket's side of the transport, write by write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False
        self.eof = False

    def write(self, data: Any) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def write_eof(self) -> None:
        self.eof = True

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.9", 4242) if name == "peername" else default


async def test_a_head_and_its_body_leave_in_one_write_at_once() -> None:
    inner = Recording()
    transport = Corked(inner, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert inner.writes == []
    assert transport.get_write_buffer_size() == 7 + 38
    transport.write(b"{}")
    assert inner.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    await asyncio.sleep(0)
    assert len(inner.writes) == 1, "the flush scheduled for the head wrote it again"


async def test_a_write_nothing_follows_leaves_on_the_next_turn() -> None:
    inner = Recording()
    transport = Corked(inner, asyncio.get_running_loop())
    transport.write(memoryview(b"chunk-1"))
    await asyncio.sleep(0)
    assert inner.writes == [b"chunk-1"]
    transport.writelines([b"a", b"b"])
    transport.write(b"c")
    transport.write(b"d")
    await asyncio.sleep(0)
    assert b"".join(inner.writes) == b"chunk-1abcd"


async def test_closing_writes_what_is_held_first_and_abort_drops_it() -> None:
    inner = Recording()
    transport = Corked(inner, asyncio.get_running_loop())
    transport.write(b"last words")
    transport.close()
    assert inner.writes == [b"last words"]
    assert inner.closed
    await asyncio.sleep(0)
    assert inner.writes == [b"last words"]

    other = Recording()
    transport = Corked(other, asyncio.get_running_loop())
    transport.write(b"never sent")
    transport.abort()
    await asyncio.sleep(0)
    assert other.writes == []
    assert other.aborted


async def test_eof_after_a_held_write_and_nothing_written_once_closed_elsewhere() -> None:
    inner = Recording()
    transport = Corked(inner, asyncio.get_running_loop())
    transport.write(b"tail")
    transport.write_eof()
    assert inner.writes == [b"tail"]
    assert inner.eof
    transport.write(b"")
    transport.write(b"late")
    inner.closed = True  # the peer went away: the transport closed itself
    await asyncio.sleep(0)
    assert inner.writes == [b"tail"]


async def test_everything_else_is_the_transport_s() -> None:
    inner = Recording()
    transport = Corked(inner, asyncio.get_running_loop())
    assert transport.get_extra_info("peername") == ("127.0.0.9", 4242)
    assert transport.is_closing() is False


async def test_the_protocol_it_wraps_gets_the_stand_in() -> None:
    seen: list[Any] = []

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            seen.append(transport)

    wrapped = corked(Protocol)()
    wrapped.connection_made(Recording())
    assert isinstance(seen[0], Corked)
