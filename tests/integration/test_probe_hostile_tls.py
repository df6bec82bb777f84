"""An https check URL whose server answers a negative chunk size, over real TLS through a
tunnelling proxy: the probe and the echo fetch give a ``protocol_error`` verdict naming the bad
chunk size, every time, and the client keeps probing (services/health/pure/http1.py). Before,
``readexactly`` raised ``ValueError`` out of the probe: no verdict, a traceback every check."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator

import pytest
import trustme

from services.health.probe_client import CheckUrl, ProbeClient

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


@contextlib.asynccontextmanager
async def tunnelling_proxy() -> AsyncIterator[str]:
    """A CONNECT proxy: it relays bytes to the host and port asked, as Squid does."""
    tasks: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        writers.append(writer)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            host, _, port = head.split()[1].rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            writers.append(up_writer)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in writers:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def hostile_tls_origin(context: ssl.SSLContext) -> AsyncIterator[int]:
    """An https server that answers every request with a negative chunk size."""

    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(NEGATIVE)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in writers:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        await server.wait_closed()


async def test_a_negative_chunk_size_over_tls_is_a_protocol_error_verdict() -> None:
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    client = ProbeClient(ssl_context=client_tls)
    async with hostile_tls_origin(server_tls) as port, tunnelling_proxy() as proxy:
        check = CheckUrl.parse(f"https://localhost:{port}/ip")
        probes = [await client.probe(proxy, check, 5.0) for _ in range(3)]
        fetched = await client.fetch(proxy, check, 5.0, limit=4096)
    await client.close()
    assert [(p.ok, p.outcome) for p in probes] == [(False, "protocol_error")] * 3, probes
    assert all("bad chunk size" in p.detail for p in probes), probes
    assert (fetched.outcome, fetched.body) == ("protocol_error", b""), fetched
    assert "bad chunk size" in fetched.detail
    assert client.idle == 0, "a connection that answered garbage is not kept"
