"""A raw nats-py client for tests of the NATS users: it keeps the server's complaints."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nats.aio.client import Client as NATS


class Client:
    """A raw nats-py client that keeps the server's complaints instead of logging them."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc = NATS()

    async def error(self, exc: Exception) -> None:
        self.errors.append(str(exc))

    def refused(self, subject: str) -> bool:
        # nats-py lowercases the server's error line, subject and all.
        said = f'permissions violation for publish to "{subject}"'.lower()
        return any(said in e.lower() for e in self.errors)


@asynccontextmanager
async def client(url: str) -> AsyncIterator[Client]:
    c = Client()
    try:
        await c.nc.connect(url, error_cb=c.error, allow_reconnect=False, connect_timeout=5)
        yield c
    finally:
        # Also after a refused login, which leaves nats-py's socket open.
        await c.nc.close()
