"""Our header parser against nats-py's own: the same dict for any bytes."""

from __future__ import annotations

import asyncio
from typing import Any

import nats.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client as NatsPy
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.runtime.nats.client import Client, QueuedFirst

LINE = st.one_of(
    st.binary(max_size=40),
    st.tuples(
        st.text(max_size=12).map(lambda s: s.encode("utf-8", "surrogatepass")),
        st.sampled_from([b":", b": ", b":\t", b" : ", b""]),
        st.binary(max_size=30),
    ).map(b"".join),
    st.sampled_from(
        [
            b"Nats-Sequence: 12",
            b"Nats Sequence: 12",
            b"\x1cName: v",
            b"Na\x1fme: v",
            b": empty name",
            b"Name:",
            b"caf\xc3\xa9: x",
            b"Name: caf\xc3\xa9 \xff",
            b"  Padded  :  value  ",
        ]
    ),
)


@given(st.lists(LINE, max_size=12))
def test_same_headers_as_nats_py_for_any_lines(lines: list[bytes]) -> None:
    raw = b"\r\n".join(lines)
    assert Client._parse_header_lines(raw) == NatsPy._parse_header_lines(raw)


@given(st.binary(max_size=300))
def test_same_headers_as_nats_py_for_any_bytes(raw: bytes) -> None:
    assert Client._parse_header_lines(raw) == NatsPy._parse_header_lines(raw)


def test_a_jetstream_message_parses_as_before() -> None:
    raw = (
        b"Nats-Stream: PROXY\r\nNats-Subject: proxy.u1.declared\r\nNats-Sequence: 7\r\n"
        b"Nats-Time-Stamp: 2026-12-03T11:00:00.123456789Z\r\nbad name: x\r\n\r\n"
    )
    parsed = Client._parse_header_lines(raw)
    assert parsed == NatsPy._parse_header_lines(raw)
    assert parsed["Nats-Sequence"] == "7"
    assert "bad name" not in parsed


def test_the_flusher_replaced_is_still_nats_py_s_and_uses_what_it_has() -> None:
    """Our flusher is nats-py's with one yield: if a release renames what it relies on, this
    fails here rather than leaving connections that never write."""
    import inspect  # noqa: PLC0415 - only this test reads source

    source = inspect.getsource(NatsPy._flusher)
    for name in ("_flush_queue", "_pending", "_pending_data_size", "_transport", "_process_op_err"):
        assert name in source, name
    assert inspect.iscoroutinefunction(Client._flusher)


def queued(kind: type[Subscription], sizes: tuple[int, ...]) -> tuple[Subscription, list[Msg]]:
    sub = Subscription(NatsPy(), id=1, subject="s")
    sub.__class__ = kind
    msgs = [Msg(NatsPy(), subject="s", data=b"x" * n) for n in sizes]
    for msg in msgs:
        sub._pending_queue.put_nowait(msg)
        sub._pending_size += len(msg.data)
    return sub, msgs


async def taken(sub: Subscription, count: int) -> tuple[list[Msg], int]:
    """``count`` messages from ``sub`` and how many tasks taking them started."""
    loop = asyncio.get_running_loop()
    started = 0

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        nonlocal started
        started += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    try:
        got = [await sub.next_msg(timeout=0.01) for _ in range(count)]
    finally:
        loop.set_task_factory(None)
    return got, started


@pytest.mark.parametrize("kind", [Subscription, QueuedFirst])
async def test_a_queued_message_is_taken_as_nats_py_takes_it(kind: type[Subscription]) -> None:
    """``QueuedFirst.next_msg`` on a subscription with messages queued: the same messages in
    order and the same pending bytes left as nats-py's, without the two tasks per message."""
    sub, msgs = queued(kind, (3, 5))

    got, started = await taken(sub, 2)

    assert got == msgs
    assert sub._pending_size == 0
    assert started == (0 if kind is QueuedFirst else 4)
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=0.01)  # none queued: nats-py's own wait
