"""An https check URL whose server answers a negative chunk size, over real TLS through a
tunnelling proxy: the probe and the echo fetch give a ``protocol_error`` verdict naming the bad
chunk size, every time, and the client keeps probing (services/health/pure/http1.py). Before,
``readexactly`` raised ``ValueError`` out of the probe: no verdict, a traceback every check."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from services.health.probe_client import CheckUrl, ProbeClient
from tests.support.loopback import listening, localhost_tls, serving

pytestmark = pytest.mark.integration

NEGATIVE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"-5\r\nhello\r\n0\r\n\r\n"
)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def tunnel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A CONNECT proxy's connection: it relays bytes to the host and port asked, as Squid
    does."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    host, _, port = head.split()[1].rpartition(":")
    up_reader, up_writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    finally:
        up_writer.close()


async def hostile(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An https origin's connection answering every request with a negative chunk size."""
    try:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(NEGATIVE)
            await writer.drain()
    finally:
        writer.close()


async def test_a_negative_chunk_size_over_tls_is_a_protocol_error_verdict() -> None:
    server_tls, client_tls = localhost_tls()
    client = ProbeClient(ssl_context=client_tls)
    async with listening(hostile, tls=server_tls) as port, serving(tunnel) as proxy:
        check = CheckUrl.parse(f"https://localhost:{port}/ip")
        probes = [await client.probe(proxy, check, 5.0) for _ in range(3)]
        fetched = await client.fetch(proxy, check, 5.0, limit=4096)
    await client.close()
    assert [(p.ok, p.outcome) for p in probes] == [(False, "protocol_error")] * 3, probes
    assert all("bad chunk size" in p.detail for p in probes), probes
    assert (fetched.outcome, fetched.body) == ("protocol_error", b""), fetched
    assert "bad chunk size" in fetched.detail
    assert client.idle == 0, "a connection that answered garbage is not kept"
