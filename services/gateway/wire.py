"""The small pieces of a request's way through the gateway that are bytes, not decisions: the
target a keep-alive connection asks again, the gateway's own headers on an answer, and a large
body streamed on (``services.gateway.server``)."""

from __future__ import annotations

import asyncio

from services.gateway.crawler import Crawler
from services.gateway.leases import Held
from services.gateway.pure import heads
from services.gateway.pure.heads import Target
from services.gateway.reading import CHUNK
from services.gateway.upstream import Upstream


class Targets:
    """A connection's last target, by the URL up to its path: a crawler's keep-alive
    connection mostly asks the same host again, and reading the URL is a good part of a small
    request's cost. What follows the authority changes neither the target nor its refusal."""

    def __init__(self) -> None:
        self.key = b""
        self.asked: tuple[str, bytes] = ("", b"")
        self.found: tuple[Target, str | None] | None = None

    def get(self, method: str, url: bytes, own_ports: tuple[int, ...]) -> tuple[Target, str | None]:
        if self.found is not None and self.asked == (method, url):
            return self.found  # the very same URL again: no need to find its authority
        key = method.encode() + b" " + url[: heads.authority_end(url)]
        if key != self.key or self.found is None:
            target = heads.target(method, url)
            self.found = (target, heads.denied(target, own_ports))
            self.key = key
        self.asked = (method, url)  # after: a URL refused is not remembered
        return self.found


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
"""The gateway's own interim answer to a body that expects one: it reads every body before it
sends the request on, so the crawler need not wait for the site's."""


def marked(seen: bytes, held: Held) -> bytes:
    """The response head with the proxy and lease it came through, after the status line."""
    end = seen.find(b"\r\n")
    if end < 0:
        return seen
    return seen[: end + 2] + ours(held) + seen[end + 2 :]


def established(held: Held) -> bytes:
    return b"HTTP/1.1 200 Connection established\r\n" + ours(held) + b"\r\n"


def ours(held: Held) -> bytes:
    return (
        b"X-Egress-Proxy: " + held.proxy.encode("ascii", "replace") + b"\r\n"
        b"X-Egress-Lease: " + held.lease_id.encode("ascii", "replace") + b"\r\n"
    )


async def copy_exactly(crawler: Crawler, up: Upstream, n: int, idle_timeout: float) -> None:
    """A request body too large to keep, streamed on; each piece within ``idle_timeout``."""
    while n > 0:
        data = await crawler.read(min(n, CHUNK), idle_timeout)
        if not data:
            raise asyncio.IncompleteReadError(b"", n)
        up.write(data)
        await up.drain(idle_timeout)
        n -= len(data)
