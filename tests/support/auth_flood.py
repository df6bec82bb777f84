"""A holder's requests and forgers' requests through one proxy at once, counted by status: what
Squid's credential cache does when others send the holder's user name with other passwords
(docs/decisions/0133-a-proxy-login-nobody-else-can-repeat.md).

Each connection is kept alive and sends one GET after another for a bounded time, so the
holder's checks and the forgers' overlap in Squid as they would under a crawl.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit


def basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


def wrong_password(password: str) -> str:
    """A password of the same shape as ``password`` that is not it."""
    while True:
        forged = (
            password[: -len(password) // 2] + secrets.token_hex(len(password))[: len(password) // 2]
        )
        if forged != password:
            return forged


@dataclass
class Counts:
    """Statuses answered to the holder's requests and to the forgers'."""

    holder: Counter[int] = field(default_factory=Counter)
    forged: Counter[int] = field(default_factory=Counter)

    def summary(self) -> str:
        return (
            f"holder {sum(self.holder.values())} requests {dict(self.holder)}, "
            f"forged {sum(self.forged.values())} requests {dict(self.forged)}"
        )


async def _status(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """The status of one response, read whole; and whether the connection stays open."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = lines[0].split(b" ", 2)
    status = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
    length, keep = 0, True
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name in {b"connection", b"proxy-connection"} and b"close" in value.lower():
            keep = False
    if length:
        await reader.readexactly(length)
    return status, keep


async def _connection(
    proxy_url: str,
    target: str,
    authorization: Callable[[], bytes],
    counted: Counter[int],
    deadline: float,
) -> None:
    parts = urlsplit(proxy_url)
    host = urlsplit(target).netloc.encode()
    loop = asyncio.get_running_loop()
    writer: asyncio.StreamWriter | None = None
    try:
        while loop.time() < deadline:
            if writer is None:
                reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
            writer.write(
                b"GET %b HTTP/1.1\r\nHost: %b\r\nProxy-Authorization: %b\r\n"
                b"Proxy-Connection: keep-alive\r\n\r\n" % (target.encode(), host, authorization())
            )
            try:
                await writer.drain()
                status, keep = await _status(reader)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                status, keep = 0, False
            counted[status] += 1
            if not keep:
                writer.close()
                writer = None
    finally:
        if writer is not None:
            writer.close()


async def flood(
    proxy_url: str,
    target: str,
    holder: Callable[[], bytes],
    forged: Callable[[], bytes],
    *,
    holders: int = 10,
    forgers: int = 30,
    seconds: float = 3.0,
) -> Counts:
    """``holders`` connections sending ``holder()``'s credential and ``forgers`` connections
    sending ``forged()``'s, all at once for ``seconds``."""
    counts = Counts()
    deadline = asyncio.get_running_loop().time() + seconds
    tasks = [
        _connection(proxy_url, target, holder, counts.holder, deadline) for _ in range(holders)
    ] + [_connection(proxy_url, target, forged, counts.forged, deadline) for _ in range(forgers)]
    await asyncio.gather(*tasks)
    return counts
