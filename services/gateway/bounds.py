"""What one connection may cost the gateway, and how a refused one ends
(docs/decisions/0156-the-gateway-s-edges.md; docs/gateway.md, "Limits").

Every wait has a bound: a request head within ``head_timeout``, a request body and every byte
relayed either way within ``idle_timeout`` of the one before, the leased proxy's connect within
``connect_timeout`` and its answer head within ``answer_timeout``. Connections are bounded per
address and in all, and so are the connections to proxies: together they stay below the
process's file descriptor limit, so that a flood is answered 429 (or 503, when the proxies'
share is spent) by the gateway instead of meeting ``EMFILE``.
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass, replace
from typing import Protocol

FD_RESERVE = 64
"""Descriptors kept for everything but crawler connections: the listening socket, NATS, the
discovery API's connections, the log, the clients file."""
UPSTREAM_SHARE = 4
"""Connections to proxies get a quarter of the descriptors (``Limits.fitted``)."""
MAX_IDLE_UPSTREAM = 1024
"""Kept-alive connections to the leased proxies, all proxies together (at most an eighth of the
descriptor limit)."""
LINGER = 2.0
"""Seconds a refused connection is still read (and what it sends dropped) after the refusal is
written, so that the crawler reads the refusal instead of a reset."""
LINGER_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    head_timeout: float = 10.0
    """How long a request head may take to arrive whole; then 408."""
    idle_timeout: float = 60.0
    """How long a request body, a response or a tunnel may go without a byte moving; a
    keep-alive connection without a next request is closed after it too."""
    connect_timeout: float = 5.0
    answer_timeout: float = 60.0
    """How long the leased proxy may take to answer a request's head."""
    per_address: int = 256
    connections: int = 20_000
    """Crawler connections in all; lowered to what the descriptor limit allows (``fitted``)."""
    upstreams: int = 10_000
    """Connections to proxies in all, idle ones included; ``fitted`` too."""

    def fitted(self, descriptors: int | None = None) -> Limits:
        """These limits within ``descriptors`` (the process's soft ``RLIMIT_NOFILE`` when not
        given), less ``FD_RESERVE``: a quarter for connections to proxies, the rest for
        crawlers. A crawler's connection holds one to a proxy only while a request or a tunnel
        is under way, so idle keep-alive crawlers (a crawl's sessions) get most of the room."""
        soft = descriptors if descriptors is not None else _soft_limit()
        if soft is None:
            return self
        room = max(soft - FD_RESERVE, 4)
        upstreams = min(self.upstreams, room // UPSTREAM_SHARE)
        connections = min(self.connections, room - room // UPSTREAM_SHARE)
        return replace(self, connections=connections, upstreams=upstreams)


def idle_upstream(descriptors: int | None = None) -> int:
    """How many idle connections to proxies the gateway keeps, all proxies together."""
    soft = descriptors if descriptors is not None else _soft_limit()
    return MAX_IDLE_UPSTREAM if soft is None else max(min(MAX_IDLE_UPSTREAM, soft // 8), 1)


def _soft_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


class Refusal(Exception):
    """An answer of the gateway's own that ends the connection; ``kind`` is counted in
    ``egress_gateway_refusals_total`` when the raiser could not count it."""

    def __init__(self, answer: bytes, kind: str = "") -> None:
        super().__init__("refused")
        self.answer = answer
        self.kind = kind


class Sink(Protocol):
    """Where an answer is written: the crawler's connection (``crawler.Crawler``), or a
    stream's writer."""

    @property
    def transport(self) -> asyncio.WriteTransport: ...

    async def drain(self) -> None: ...


async def drain(writer: Sink, timeout: float) -> None:
    """``writer.drain()`` within ``timeout``: a crawler that stops reading is a slow client
    like one that stops sending (``TimeoutError``). Nothing to wait for when the transport
    has sent everything already: the common case, and a timer saved."""
    transport = writer.transport
    if not transport.get_write_buffer_size() and not transport.is_closing():
        return
    async with asyncio.timeout(timeout):
        await writer.drain()


def close(writer: asyncio.StreamWriter, timeout: float) -> None:
    """Close ``writer``; what it still has to send gets ``timeout`` seconds, then the connection
    is reset. A plain close waits for the peer to take the rest, for ever if it never reads, and
    holds the descriptor meanwhile."""
    writer.close()
    transport = writer.transport
    if transport.get_write_buffer_size():
        asyncio.get_running_loop().call_later(timeout, transport.abort)
