"""A TCP relay in front of the discovery API that loses answers: the network fault a client's
retry exists for, made with real sockets rather than a fake transport.

Every connection is relayed to the API byte for byte, except that the answer to the first
connection carrying a chosen request line is swallowed and the connection closed: the API did the
work, the client never hears of it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class Relay:
    upstream_port: int
    lose_first: bytes
    """The request line (``b"POST /v1/leases "``) whose first answer is lost."""
    port: int = 0
    requests: list[bytes] = field(default_factory=list)
    """What clients sent, one item per chunk read, in order."""
    lost: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        api_in, api_out = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        lose = asyncio.Event()

        async def upward() -> None:
            while chunk := await client_in.read(65536):
                self.requests.append(chunk)
                if self.lost == 0 and chunk.startswith(self.lose_first):
                    self.lost += 1
                    lose.set()
                api_out.write(chunk)
                await api_out.drain()

        async def downward() -> None:
            while chunk := await api_in.read(65536):
                if lose.is_set():
                    return  # the API answered; the client will never know
                client_out.write(chunk)
                await client_out.drain()

        up = asyncio.create_task(upward())
        try:
            await downward()
        finally:
            up.cancel()
            await asyncio.gather(up, return_exceptions=True)
            for writer in (client_out, api_out):
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()


@contextlib.asynccontextmanager
async def lossy_relay(upstream_port: int, lose_first: bytes) -> AsyncIterator[Relay]:
    relay = Relay(upstream_port, lose_first)
    server = await asyncio.start_server(relay.serve, "127.0.0.1", 0)
    relay.port = server.sockets[0].getsockname()[1]
    try:
        yield relay
    finally:
        server.close()
        await server.wait_closed()
