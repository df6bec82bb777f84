"""Slow and vanishing clients against a real discovery replica over real sockets.

Before the bounds (docs/decisions/0095-the-console-and-the-api-bound.md) 60 of 60 connections that
sent their request a byte at a time were still open after 55 s, and each client that left mid-body
logged a traceback. Here each slow connection must be closed within the bound (plus a margin for a
busy machine), a normal request must be answered while they hang, and the log must hold one line per
closed or vanished client and no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from urllib.parse import urlsplit

import httpx
import pytest

from services.discovery.http.limits import BODY_TIMEOUT, HEAD_TIMEOUT
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

SLOW = 30
"""Connections of each kind (slow head, slow body): 60 in all."""
GONE = 10
"""Clients that send half a body and leave."""
MARGIN = 10.0
"""What a busy machine may add to a bound before the connection is seen closed."""
HEAD = b"POST /v1/leases HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"


async def _open(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    url = urlsplit(base)
    assert url.hostname is not None
    assert url.port is not None
    return await asyncio.open_connection(url.hostname, url.port)


async def _trickle(
    writer: asyncio.StreamWriter, start: bytes, byte: bytes, sending: list[bytes]
) -> None:
    """``start`` (then noted in ``sending``), then one ``byte`` a second, until the server
    closes the connection."""
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(start)
        await writer.drain()
        sending.append(start)
        while not writer.is_closing():
            await asyncio.sleep(1)  # the slow client's pace: what the server must bound
            writer.write(byte)
            await writer.drain()


async def _slow(
    base: str, start: bytes, byte: bytes, bound: float, sending: list[bytes]
) -> tuple[float, bytes]:
    """Seconds until the server closed the connection, and what it answered."""
    reader, writer = await _open(base)
    opened = time.monotonic()
    sender = asyncio.create_task(_trickle(writer, start, byte, sending))
    try:
        async with asyncio.timeout(bound + MARGIN + 30):  # never hang the suite
            answer = b""
            with contextlib.suppress(ConnectionError):
                while chunk := await reader.read(65536):
                    answer += chunk
        return time.monotonic() - opened, answer
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        writer.close()


async def _leave_mid_body(base: str) -> None:
    _reader, writer = await _open(base)
    writer.write(HEAD + b"Content-Length: 200\r\n\r\n" + b'{"selector": {')
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def test_slow_and_vanishing_clients_are_bounded_and_logged_once(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    captured_logs: pytest.CaptureFixture[str],
) -> None:
    await ready_proxy(jetstream_store, "p1", {"country": "de"})
    async with (
        discovery(nats_server.url) as (_service, base),
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        captured_logs.readouterr()  # the start-up lines
        sending: list[bytes] = []
        heads = [
            _slow(
                base,
                b"GET /v1/proxies HTTP/1.1\r\nHost: test\r\nX-Slow: ",
                b"a",
                HEAD_TIMEOUT,
                sending,
            )
            for _ in range(SLOW)
        ]
        bodies = [
            _slow(base, HEAD + b"Content-Length: 1000\r\n\r\n{", b" ", BODY_TIMEOUT, sending)
            for _ in range(SLOW)
        ]
        slow = asyncio.gather(*heads, *bodies)
        await until(lambda: len(sending) == 2 * SLOW, timeout=30, what="all connected and sending")
        answered = await client.get("/v1/proxies")
        assert answered.status_code == 200
        assert [p["uid"] for p in answered.json()["items"]] == ["p1"]
        await asyncio.gather(*(_leave_mid_body(base) for _ in range(GONE)))
        closed = await slow
        assert (await client.get("/healthz")).status_code == 200

    for seconds, answer in closed[:SLOW]:
        assert seconds <= HEAD_TIMEOUT + MARGIN
        assert answer == b""  # no request, no answer: the connection is closed
    for seconds, answer in closed[SLOW:]:
        assert seconds <= BODY_TIMEOUT + MARGIN
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"connection: close" in head.lower()
        assert json.loads(body)["error"] == "request_timeout"

    out = captured_logs.readouterr()
    logged = out.out + out.err
    assert "Traceback" not in logged, logged
    lines = logged.splitlines()
    assert sum("no whole request head" in line for line in lines) == SLOW, logged
    assert sum("status=408" in line for line in lines) == SLOW, logged
    assert sum("client left before sending its whole request" in line for line in lines) == GONE
