"""Bounds on what one HTTP client can hold of a discovery replica: time to send a request, its
size, and idle connections (docs/decisions/0095-the-console-and-the-api-bound.md).

uvicorn bounds idle time between requests (``timeout_keep_alive``), connections
(``limit_concurrency``) and, with h11 only, a head's size (``h11_max_incomplete_event_size``),
but not the time a client takes to send a request: any byte resets its keep-alive timer, and a
connection that never sends a whole head has no timer at all. So a client sending a byte every
few seconds held a connection and its buffers for as long as it liked. Two bounds close that:

- ``head_deadline`` (a small subclass of uvicorn's protocol): a connection that has not sent a
  whole request head within ``head_timeout`` of opening, or of its previous answer, or whose
  head grows past ``MAX_HEAD_BYTES``, is closed.
- ``BodyDeadline`` (ASGI, outermost): the body is read in full before the app sees the request,
  within ``body_timeout`` (else 408) and up to ``max_body`` bytes (else 413), both answered with
  ``Connection: close``. A client that leaves mid-body ends the request there.
- ``IdleConnections``: connections waiting for a request head (just opened, or kept alive
  between requests) are at most ``IDLE_PER_ADDRESS`` per client address (an IPv6 address's /64);
  one more closes that address's oldest. uvicorn answers 503 to everyone once ``MAX_CONNECTIONS``
  are open, so without it one address holding 1,010 idle sockets made every request 503 for the
  head timeout (D135). Addresses of trusted proxies (``--trusted-proxies``) are not capped: they
  carry everyone's connections.

Each of these ends is one log line naming the client, without a traceback: a client that goes
away is not an error of ours.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

import msgspec
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from services.discovery.http.errors import ErrorBody
from services.discovery.pure.errorcodes import STATUS, ErrorCode

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools has wheels wherever uvicorn[standard] does
    HttpToolsProtocol = None  # type: ignore[assignment,misc] # the h11 protocol serves instead

log = structlog.get_logger("egress.discovery")

HEAD_TIMEOUT = 10.0
"""Seconds a connection has to send a whole request head (from opening, or its last answer)."""
BODY_TIMEOUT = 10.0
"""Seconds a request has to send its whole body, once its head is in."""
KEEP_ALIVE = 5.0
"""Seconds an idle connection is kept between requests (uvicorn's ``timeout_keep_alive``)."""
MAX_CONNECTIONS = 1000
"""Connections and requests under way beyond which uvicorn answers 503 (``limit_concurrency``)."""
MAX_HEAD_BYTES = 16 * 1024
"""The most a request head may take (also h11's ``max_incomplete_event_size``; httptools has
no bound of its own)."""
IDLE_PER_ADDRESS = 128
"""Connections one client address may keep waiting for a request head; a crawler's pool of
keep-alive connections (httpx keeps 100 at most) fits."""

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _client(scope_or_addr: Any) -> str:
    addr = scope_or_addr.get("client") if isinstance(scope_or_addr, dict) else scope_or_addr
    return f"{addr[0]}:{addr[1]}" if addr else "unknown"


class _Refusal(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class BodyDeadline:
    """Reads each request's body in full, within ``timeout`` and ``max_body``, before the app
    runs; the app then gets the body at once and, after it, the server's own ``receive`` (which
    says when the client disconnects)."""

    def __init__(self, app: ASGIApp, *, max_body: int, timeout: float = BODY_TIMEOUT) -> None:
        self.app = app
        self.max_body = max_body
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await self._body(scope, receive)
        except _Refusal as exc:
            log.warning(
                "request refused before its body was read",
                client=_client(scope),
                method=scope["method"],
                path=scope["path"],
                status=STATUS[exc.code],
                reason=str(exc),
            )
            await _answer(send, exc.code, str(exc))
            return
        if body is None:
            log.info(
                "client left before sending its whole request",
                client=_client(scope),
                method=scope["method"],
                path=scope["path"],
            )
            return
        await self.app(scope, _replay(body, receive), send)

    async def _body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body; None if the client left first."""
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            raise _Refusal(
                ErrorCode.BODY_TOO_LARGE,
                f"the request body is too large ({self.max_body} bytes at most)",
            )
        parts: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body:
                        raise _Refusal(
                            ErrorCode.BODY_TOO_LARGE,
                            f"the request body is too large ({self.max_body} bytes at most)",
                        )
                    parts.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(parts)
        except TimeoutError:
            raise _Refusal(
                ErrorCode.REQUEST_TIMEOUT,
                f"the request body did not arrive within {self.timeout:g} s; send it at once",
            ) from None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _answer(send: Send, code: ErrorCode, message: str) -> None:
    """The API's error shape (``services.discovery.http.errors``), and the connection closed after
    it: the rest of the request is still on the way, or never coming."""
    body = msgspec.json.encode(ErrorBody(error=code, message=message))
    await send(
        {
            "type": "http.response.start",
            "status": STATUS[code],
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def address_group(host: str) -> str:
    """What counts as one client address: an IPv4 address (an IPv4-mapped IPv6 one too), or an
    IPv6 address's /64, the block one host is given. Anything else (a Unix socket) as it is."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def trusted(host: str, networks: Collection[Network]) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in network for network in networks)


_UNSEEN = object()
_GROUPS_KEPT = 4096
"""Client hosts whose address group is kept; past it the table starts again."""


class IdleConnections:
    """The connections of one server waiting for a request head, per client address; beyond
    ``per_address``, the address's oldest is closed."""

    def __init__(self, per_address: int = IDLE_PER_ADDRESS, exempt: Collection[Network] = ()):
        self.per_address = per_address
        self.exempt = tuple(exempt)
        self._by_group: dict[str, OrderedDict[asyncio.BaseTransport, None]] = {}
        self._groups: dict[str, object] = {}

    def _group(self, host: str) -> str | None:
        """``host``'s address group; None when it is exempt. Kept per host: parsing an address
        twice per request cost more than the rest of this class."""
        found = self._groups.get(host, _UNSEEN)
        if found is _UNSEEN:
            if len(self._groups) >= _GROUPS_KEPT:
                self._groups.clear()
            found = None if trusted(host, self.exempt) else address_group(host)
            self._groups[host] = found
        return found  # type: ignore[return-value] # _UNSEEN was replaced above

    def waiting(self, host: str, transport: asyncio.BaseTransport) -> None:
        group = self._group(host)
        if group is None:
            return
        held = self._by_group.setdefault(group, OrderedDict())
        held[transport] = None
        held.move_to_end(transport)
        while len(held) > self.per_address:
            oldest, _ = held.popitem(last=False)
            if not oldest.is_closing():
                log.info(
                    "connection closed: its address holds too many idle ones",
                    client=group,
                    bound=self.per_address,
                )
                oldest.close()
        if not held:
            del self._by_group[group]

    def busy(self, host: str, transport: asyncio.BaseTransport) -> None:
        group = self._group(host)
        if group is None:
            return
        held = self._by_group.get(group)
        if held is not None:
            held.pop(transport, None)
            if not held:
                del self._by_group[group]

    def held(self, host: str) -> int:
        return len(self._by_group.get(address_group(host), ()))


class _HeadTimer:
    """Closes a connection that does not send a whole request head within ``head_timeout`` of
    opening or of its last answer. Mixed into uvicorn's protocols, ahead of them."""

    head_timeout: float = HEAD_TIMEOUT
    idle: IdleConnections | None = None
    """Shared by every connection of one server (``head_deadline``)."""
    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0
    transport: asyncio.Transport
    client: tuple[str, int] | None
    cycle: Any

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc] # the protocol next in the MRO
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc] # the protocol next in the MRO
        if self._head_timer is None:
            return  # a head is in (or the connection is closing)
        self._head_bytes += len(data)  # all of it is head: the head is still not whole
        if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            log.info(
                "connection closed: request head over the bound",
                client=_client(self.client),
                bytes=MAX_HEAD_BYTES,
            )
            self._disarm_head_timer()
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc] # the protocol next in the MRO
        waiting = self.cycle is None or self.cycle.response_complete  # no pipelined request
        if waiting and not self.transport.is_closing():
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        if self.idle is not None and self.client:
            self.idle.busy(self.client[0], self.transport)  # also after its head timed out
        super().connection_lost(exc)  # type: ignore[misc] # the protocol next in the MRO

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_bytes = 0
        loop = asyncio.get_running_loop()
        self._head_timer = loop.call_later(self.head_timeout, self._head_timed_out)
        if self.idle is not None and self.client:
            self.idle.waiting(self.client[0], self.transport)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
            if self.idle is not None and self.client:
                self.idle.busy(self.client[0], self.transport)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        log.info(
            "connection closed: no whole request head within the bound",
            client=_client(self.client),
            seconds=self.head_timeout,
        )
        self.transport.close()


class H11HeadDeadline(_HeadTimer, H11Protocol):
    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm_head_timer()  # a head is in: the body has its own bound


def head_deadline(
    timeout: float = HEAD_TIMEOUT, idle: IdleConnections | None = None
) -> type[asyncio.Protocol]:
    """uvicorn's fastest HTTP protocol available, with the head bound of ``timeout`` and, with
    ``idle``, the bound on connections per address waiting for a head."""
    idle_connections = idle
    if HttpToolsProtocol is None:  # pragma: no cover
        fields = {"head_timeout": timeout, "idle": idle}
        return type("H11HeadDeadline", (H11HeadDeadline,), fields)

    class HttpToolsHeadDeadline(_HeadTimer, HttpToolsProtocol):
        head_timeout = timeout
        idle = idle_connections

        def on_headers_complete(self) -> None:
            self._disarm_head_timer()  # a head is in: the body has its own bound
            super().on_headers_complete()

    return HttpToolsHeadDeadline
