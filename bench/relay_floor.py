"""The least a Python process can spend relaying a proxy request: bytes copied both ways between
a client and one upstream connection, on uvloop, with no parsing, no login and no lease
(docs/benchmarks.md, "The gateway"). bench/gateway.py measures it beside the gateway so that the
gateway's own cost is told apart from what any relay on this machine pays for its sockets.

    python -m bench.relay_floor --port 8100 --upstream 127.0.0.1:3128
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast

import uvloop


class _Pipe(asyncio.Protocol):
    """One side of a relayed pair: what arrives is written to the peer; the peer's full buffer
    pauses this side (flow control, as the gateway's ``drain``)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Pipe | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
            return
        peer.transport.write(data)

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


class _Client(_Pipe):
    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__()
        self.upstream = upstream

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(_Pipe, *self.upstream)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        up.peer, self.peer = self, up
        for data in self.pending:
            assert up.transport is not None
            up.transport.write(data)
        self.pending.clear()


async def serve(port: int, upstream: tuple[str, int]) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstream), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the proxy")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    uvloop.run(serve(args.port, (host, int(port))))


if __name__ == "__main__":
    main()
