"""The health service's echo fetch against a "proxy" that answers anything at all: whatever the
bytes, it returns an answer with an outcome (never raises), keeps at most the limit of a body,
and gives up within its timeout (services/health/probe_client.py, ``ProbeClient.fetch``)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest

from services.health.probe_client import CheckUrl, ProbeClient
from tests.support.loopback import serving

pytestmark = pytest.mark.integration

LIMIT = 4096
ECHO = CheckUrl.parse("http://echo.invalid/ip")


def fake_proxy(
    reply: bytes, *, endless: bytes = b""
) -> contextlib.AbstractAsyncContextManager[str]:
    """Reads a request head, writes ``reply``, then ``endless`` for ever (or closes)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(reply)
        await writer.drain()
        while endless:
            writer.write(endless)
            await writer.drain()
        writer.close()

    return serving(answer)


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"


@pytest.mark.parametrize(
    ("reply", "endless", "outcome"),
    [
        (HEAD + b"Content-Length: 12\r\n\r\n203.0.113.7\n", b"", "ok"),
        (HEAD + b"Content-Length: 99999999\r\n\r\n", b"x" * 65536, "ok"),  # kept to the limit
        (
            HEAD + b"Transfer-Encoding: chunked\r\n\r\n",
            b"10000\r\n" + b"y" * 65536 + b"\r\n",
            "protocol_error",
        ),
        (HEAD + b"\r\n", b"z" * 65536, "ok"),  # a body until close that never closes
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", b"", "protocol_error"),
        (b"\x00\xff garbage \xfe\r\n\r\n", b"", "protocol_error"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"h" * (1 << 20), b"", "protocol_error"),  # no end of head
        (b"", b"", "connection_lost"),  # closed at once
    ],
)
async def test_any_answer_is_an_outcome_with_a_bounded_body(
    reply: bytes, endless: bytes, outcome: str
) -> None:
    client = ProbeClient()
    async with fake_proxy(reply, endless=endless) as proxy:
        got = await client.fetch(proxy, ECHO, 3.0, limit=LIMIT)
    assert got.outcome == outcome, got
    assert len(got.body) <= LIMIT + 1


async def test_a_proxy_that_never_answers_is_a_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)  # the proxy that never answers: what the test is about

    async with serving(silent) as proxy:
        got = await ProbeClient().fetch(proxy, ECHO, 0.5, limit=LIMIT)
    assert (got.outcome, got.detail) == ("timeout", "no answer within 0.5s")


async def test_nothing_listening_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    got = await ProbeClient().fetch(f"http://127.0.0.1:{port}", ECHO, 2.0, limit=LIMIT)
    assert got.outcome == "connect_error"
