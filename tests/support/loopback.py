"""Raw asyncio servers on loopback, for tests that answer a client byte by byte (a proxy or an
origin that misbehaves, docs/architecture.md "Health"): every handler is cancelled and every
connection closed when the test is done with the server, so no task outlives the test. A
handler's own exceptions end its connection only: a client that hangs up is no failure.

``localhost_tls`` gives a server and a client context trusting each other, from a CA made for
the test, for https on ``localhost``."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

import trustme

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def listening(handle: Handler, *, tls: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    """A server on 127.0.0.1 running ``handle`` per connection (over TLS with ``tls``); its
    port."""
    tasks: set[asyncio.Task[None]] = set()
    writers: set[asyncio.StreamWriter] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        with contextlib.suppress(Exception):
            await handle(reader, writer)

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    try:
        yield server.sockets[0].getsockname()[1]
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
async def serving(handle: Handler) -> AsyncIterator[str]:
    """``listening`` over plain TCP; the server's URL, as a proxy's is given to a client."""
    async with listening(handle) as port:
        yield f"http://127.0.0.1:{port}"


def localhost_tls() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a certificate for ``localhost``, and a client context trusting
    only its CA."""
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client
