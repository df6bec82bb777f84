"""One request through a leased proxy: a plain HTTP exchange, or a CONNECT tunnel
(docs/gateway.md, "How a request goes").

The upstream connections are the leased proxies' (Squid's) ports. A plain request is sent with
the lease's login in place of the crawler's and its response read until the head, which decides
(``pure.outcomes``) whether the crawler gets it or the request goes once more through another
proxy; then the rest passes straight to the crawler from the connection's protocol
(``upstream.Upstream``). Connections to a proxy are kept for the next request (``Upstreams``),
whichever lease of that proxy it is for: the login rides on each request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from dataclasses import dataclass

from services.gateway.bounds import Refusal
from services.gateway.pure import heads
from services.gateway.pure.heads import HeadError, Target, connect_head
from services.gateway.reading import MAX_HEAD, Response
from services.gateway.upstream import Upstream, UpstreamError

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class Traffic:
    """What one exchange moved: counted per client, per proxy and per lease."""

    up: int = 0
    down: int = 0


class Upstreams:
    """Connections to the proxies: idle keep-alive ones for plain requests (``Upstream``
    protocols) per proxy address, bounded per proxy (``per_proxy``) and in all (``max_idle``):
    beyond, a connection given back is closed. A proxy without idle connections has no entry,
    so the proxies a gateway once used do not accumulate. Tunnels get fresh stream connections
    (``connect``); both kinds count in ``max_open``."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        per_proxy: int = 32,
        max_idle: int = 1024,
        max_open: int = 10_000,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.per_proxy = per_proxy
        self.max_idle = max_idle
        self.max_open = max_open
        self.idle = 0
        self.open_now = 0
        """Connections to proxies whose descriptor is not closed yet, idle ones included."""
        self._idle: defaultdict[tuple[str, int], list[Upstream]] = defaultdict(list)
        self._watching: set[asyncio.Task[None]] = set()

    def idle_one(self, host: str, port: int) -> Upstream | None:
        """An idle connection to the proxy, if one is open."""
        idle = self._idle.get((host, port))
        while idle:
            up = idle.pop()
            self.idle -= 1
            if not idle:
                del self._idle[(host, port)]
            if not up.closed:
                return up
            up.close()
        return None

    async def take(self, host: str, port: int, *, fresh: bool = False) -> Upstream:
        """A connection to the proxy for a plain request: an idle one unless ``fresh``."""
        if not fresh:
            up = self.idle_one(host, port)
            if up is not None:
                return up
        self._room()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, up = await loop.create_connection(lambda: Upstream(self._lost), host, port)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"the proxy {host}:{port} cannot be reached: {exc!r}") from exc
        if up.lost:
            raise UpstreamError(f"the proxy {host}:{port} closed the connection at once")
        self.open_now += 1
        up.counted = True
        return up

    async def connect(self, host: str, port: int) -> Conn:
        """A fresh connection to the proxy as streams, for a tunnel."""
        self._room()
        try:
            async with asyncio.timeout(self.connect_timeout):
                conn = await asyncio.open_connection(host, port, limit=MAX_HEAD)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"the proxy {host}:{port} cannot be reached: {exc!r}") from exc
        self.open_now += 1
        watch = asyncio.create_task(_closed(conn[1]))
        self._watching.add(watch)
        watch.add_done_callback(self._forget)
        return conn

    def _room(self) -> None:
        if self.open_now >= self.max_open:
            # The gateway's own bound, not the proxy's fault: nothing is reported against it.
            reason = "the gateway holds as many connections to proxies as it may; try again"
            answer = heads.answer(503, reason, extra=[(b"Retry-After", b"1")])
            raise Refusal(answer, "upstreams")

    def _lost(self) -> None:
        self.open_now -= 1

    def _forget(self, watch: asyncio.Task[None]) -> None:
        self._watching.discard(watch)
        self.open_now -= 1

    def give_back(self, host: str, port: int, up: Upstream) -> None:
        """The connection after a request: kept for the next one when its answer ended as
        framed, closed otherwise or beyond the bounds."""
        idle = self._idle.get((host, port), [])
        if not up.reusable or len(idle) >= self.per_proxy or self.idle >= self.max_idle:
            up.close()
            return
        up.done()
        self._idle[(host, port)].append(up)
        self.idle += 1

    def close(self) -> None:
        for ups in self._idle.values():
            for up in ups:
                up.close()
        self._idle.clear()
        self.idle = 0
        for watch in self._watching:
            watch.cancel()


async def _closed(writer: asyncio.StreamWriter) -> None:
    """Until the connection's descriptor is closed, however it ends."""
    with contextlib.suppress(Exception):
        await writer.wait_closed()


async def open_tunnel(
    upstreams: Upstreams,
    host: str,
    port: int,
    login: bytes | None,
    *,
    target: Target,
    timeout: float,
) -> tuple[Conn, Response]:
    """A CONNECT through the proxy; the connection and the proxy's answer (200: open)."""
    conn = await upstreams.connect(host, port)
    reader, writer = conn
    response = Response(head_only=True)
    try:
        writer.write(connect_head(target, login))
        await writer.drain()
        # Exactly the head: what follows it is the tunnel's (a server that speaks first).
        async with asyncio.timeout(timeout):
            response.feed(await reader.readuntil(b"\r\n\r\n"))
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        writer.close()
        raise UpstreamError(f"the proxy did not answer the CONNECT: {exc!r}") from exc
    except (TimeoutError, HeadError):
        writer.close()
        raise
    return conn, response
