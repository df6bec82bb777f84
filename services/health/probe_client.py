"""The probe client: one HTTP GET of the check URL, sent *through* a proxy, on asyncio streams.

Why a client of our own rather than a general one: one replica sends about one request per proxy
per second to thousands of proxies. A general client keeps a pool, a transport and their
bookkeeping per proxy URL; this one keeps at most one idle connection per proxy (probes of one
proxy never overlap), parses only what a probe needs, and costs a fraction of the CPU
(docs/benchmarks.md).

Why a connection is kept only for frequent probes: an idle connection costs the replica about
3 KB (and the proxy a socket) for the whole interval, to save one connect per probe (about
0.4 ms of CPU here). At an interval of a second that saves thousands of connects a second; at
half a minute, 10,000 idle connections cost 32 MB to save a few hundred (docs/benchmarks.md).
The prober decides per probe (``keep_alive``); a probe that does not keep asks for
``Connection: close`` and closes its connection once answered.

Why exactly three headers (``Host``, ``User-Agent``, ``Connection``): the request leaves through
the proxy toward an external site, and nothing internal may leak there — no ``traceparent`` or
``tracestate`` (even when the probe runs inside a span), no event or service header. The request
is written from a fixed template, never from a header mapping something else could add to. The
one more, ``Proxy-Authorization`` (the probe credential of a proxy that enforces leases, D84), is
for the proxy, which consumes it; it is never sent inside a ``CONNECT`` tunnel.

An ``http`` check URL is sent in absolute form to the proxy; an ``https`` one goes through a
``CONNECT`` tunnel and TLS, as a crawler's request would.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from services.health.pure.http1 import Head, HttpRefused, chunk_size, parse_head, status_of
from services.runtime.settings.errors import ConfigError

USER_AGENT = "egress-proxies-health/1"
_HEAD_LIMIT = 64 * 1024
_BODY_LIMIT = 1024 * 1024
_MAX_TRAILERS = 64


class ProbeError(Exception):
    """A probe that failed; ``outcome`` is the metrics label."""

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome


class _Stale(Exception):
    """A reused connection closed before answering: the proxy dropped an idle connection."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class CheckUrl:
    """A parsed check URL: where the request goes and what its request line says."""

    url: str
    tls: bool
    target: Endpoint
    host_header: str
    path: str

    @classmethod
    def parse(cls, url: str) -> CheckUrl:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"check URL {url!r}: use an http:// or https:// URL")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        host = parts.hostname
        default = port == (443 if tls else 80)
        shown = f"[{host}]" if ":" in host else host
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(url, tls, Endpoint(host, port), shown if default else f"{shown}:{port}", path)


def provider_check_urls(
    pairs: tuple[str, ...], flag: str = "--provider-check-url"
) -> dict[str, str]:
    """``NAME=URL`` pairs (``flag``, repeated); each URL must be one the prober can fetch."""
    found: dict[str, str] = {}
    for pair in pairs:
        name, sep, url = pair.partition("=")
        if not sep or not name.strip():
            raise ConfigError(
                f"{flag}: {pair!r} is not NAME=URL; e.g. local=http://127.0.0.1:8081/"
            )
        try:
            CheckUrl.parse(url.strip())
        except ValueError as exc:
            raise ConfigError(f"{flag} {name}: {exc}") from exc
        found[name.strip()] = url.strip()
    return found


def proxy_endpoint(proxy_url: str) -> Endpoint:
    parts = urlsplit(proxy_url if "://" in proxy_url else f"http://{proxy_url}")
    if not parts.hostname:
        raise ValueError(f"proxy URL {proxy_url!r} names no host")
    return Endpoint(parts.hostname, parts.port or 3128)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ok: bool
    outcome: str
    """``ok``, ``timeout``, ``connect_error``, ``connection_lost``, ``bad_status``,
    ``tunnel_refused``, ``tls_error`` or ``protocol_error``: the metrics label."""
    latency_ms: float
    status: int = 0
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Fetched:
    """An answer with its body (an echo URL's), or a failure with its outcome and detail."""

    outcome: str
    status: int = 0
    content_type: str = ""
    body: bytes = b""
    detail: str = ""


class _Conn:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tunnel: str
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.tunnel = tunnel

    def close(self) -> None:
        self.writer.close()


class ProbeClient:
    """Probes through many proxies, keeping at most one idle keep-alive connection per proxy."""

    def __init__(
        self, *, user_agent: str = USER_AGENT, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.user_agent = user_agent
        self.ssl_context = ssl_context or ssl.create_default_context()
        self._idle: dict[str, _Conn] = {}
        self.proxy_auth: Callable[[str], str] | None = None
        """The ``Proxy-Authorization`` value for a proxy URL (``""``: none); see credentials.py."""

    @property
    def idle(self) -> int:
        """Connections kept open between probes."""
        return len(self._idle)

    async def probe(
        self, proxy_url: str, check: CheckUrl, timeout: float, *, keep_alive: bool = True
    ) -> ProbeResult:
        """Never raises for a failed probe: a failure is an answer, with its outcome. Without
        ``keep_alive`` the connection is closed once answered (an idle one is still used)."""
        started = time.perf_counter()
        status = 0
        try:
            async with asyncio.timeout(timeout):
                status = await self._exchange(proxy_url, check, keep_alive)
        except TimeoutError:
            self.forget(proxy_url)
            return _result(False, "timeout", started, 0, f"no answer within {timeout:g}s")
        except ProbeError as exc:
            return _result(False, exc.outcome, started, 0, str(exc))
        if 200 <= status < 400:
            return _result(True, "ok", started, status, "")
        return _result(False, "bad_status", started, status, f"HTTP {status}")

    async def fetch(
        self, proxy_url: str, check: CheckUrl, timeout: float, *, limit: int
    ) -> Fetched:
        """GET ``check`` through the proxy on a connection of its own (closed after), keeping
        at most ``limit`` + 1 bytes of the body: an echo's answer is a line, and anything
        longer is refused by its reader. Never raises for a failed fetch."""
        try:
            async with asyncio.timeout(timeout):
                conn = await self._open(
                    proxy_url, check, check.target.authority if check.tls else ""
                )
                try:
                    return await self._fetch_on(proxy_url, conn, check, limit)
                finally:
                    conn.close()
        except TimeoutError:
            return Fetched("timeout", detail=f"no answer within {timeout:g}s")
        except ProbeError as exc:
            return Fetched(exc.outcome, detail=str(exc))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            return Fetched("connection_lost", detail=f"connection lost: {exc!r}")

    async def _fetch_on(self, proxy_url: str, conn: _Conn, check: CheckUrl, limit: int) -> Fetched:
        target = check.path if check.tls else check.url
        auth = "" if check.tls else self._auth_line(proxy_url)
        conn.writer.write(
            f"GET {target} HTTP/1.1\r\nHost: {check.host_header}\r\n"
            f"User-Agent: {self.user_agent}\r\n{auth}Connection: close\r\n\r\n".encode("latin-1")
        )
        await conn.writer.drain()
        head = await _read_head(conn.reader, reused=False)
        if head.chunked:
            body = await _read_chunked(conn.reader, keep=limit + 1)
        elif head.length is not None:
            body = await conn.reader.readexactly(min(head.length, limit + 1))
        else:
            body = b""
            while len(body) <= limit and (more := await conn.reader.read(limit + 1 - len(body))):
                body += more  # a body until close: up to the limit
        status, content_type = head.status, head.content_type
        return Fetched("ok", status, content_type, body[: limit + 1])

    def forget(self, proxy_url: str) -> None:
        """Drop the idle connection to a proxy (no longer probed here, or in doubt)."""
        conn = self._idle.pop(proxy_url, None)
        if conn is not None:
            conn.close()

    async def close(self) -> None:
        for key in list(self._idle):
            self.forget(key)

    async def _exchange(self, proxy_url: str, check: CheckUrl, keep_alive: bool) -> int:
        tunnel = check.target.authority if check.tls else ""
        conn = self._idle.pop(proxy_url, None)
        if conn is not None and conn.tunnel != tunnel:
            conn.close()
            conn = None
        if conn is not None:
            try:
                return await self._request(proxy_url, conn, check, keep_alive, reused=True)
            except _Stale:
                pass  # the proxy closed it while idle; a fresh connection decides
        conn = await self._open(proxy_url, check, tunnel)
        try:
            return await self._request(proxy_url, conn, check, keep_alive, reused=False)
        except _Stale as exc:
            raise ProbeError("connection_lost", "connection closed before an answer") from exc

    async def _request(
        self, proxy_url: str, conn: _Conn, check: CheckUrl, keep_alive: bool, *, reused: bool
    ) -> int:
        target = check.path if check.tls else check.url
        connection = "keep-alive" if keep_alive else "close"
        auth = "" if check.tls else self._auth_line(proxy_url)
        request = (
            f"GET {target} HTTP/1.1\r\nHost: {check.host_header}\r\n"
            f"User-Agent: {self.user_agent}\r\n{auth}Connection: {connection}\r\n\r\n"
        )
        try:
            conn.writer.write(request.encode("latin-1"))
            await conn.writer.drain()
            status, keep = await _read_response(conn.reader, reused=reused)
        except _Stale:
            conn.close()
            raise
        except BaseException as exc:
            conn.close()
            if isinstance(exc, (ConnectionError, OSError, asyncio.IncompleteReadError)):
                raise ProbeError("connection_lost", f"connection lost: {exc!r}") from exc
            raise
        if keep and keep_alive and proxy_url not in self._idle:
            self._idle[proxy_url] = conn
        else:
            conn.close()  # not kept, or one idle connection per proxy is enough
        return status

    async def _open(self, proxy_url: str, check: CheckUrl, tunnel: str) -> _Conn:
        try:
            proxy = proxy_endpoint(proxy_url)
        except ValueError as exc:
            raise ProbeError("protocol_error", str(exc)) from exc
        try:
            reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
        except OSError as exc:
            raise ProbeError("connect_error", f"proxy {proxy.authority}: {exc}") from exc
        conn = _Conn(reader, writer, tunnel)
        if not tunnel:
            return conn
        try:
            await self._connect_tunnel(conn, check, self._auth_line(proxy_url))
        except BaseException:
            conn.close()
            raise
        return conn

    def _auth_line(self, proxy_url: str) -> str:
        value = self.proxy_auth(proxy_url) if self.proxy_auth is not None else ""
        return f"Proxy-Authorization: {value}\r\n" if value else ""

    async def _connect_tunnel(self, conn: _Conn, check: CheckUrl, auth: str = "") -> None:
        authority = check.target.authority
        conn.writer.write(
            f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
            f"User-Agent: {self.user_agent}\r\n{auth}\r\n".encode("latin-1")
        )
        try:
            await conn.writer.drain()
            head = await conn.reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise ProbeError("connection_lost", f"CONNECT {authority}: {exc!r}") from exc
        try:
            status = status_of(head)
        except HttpRefused as exc:
            raise ProbeError("protocol_error", f"CONNECT {authority}: {exc}") from exc
        if status != 200:
            raise ProbeError("tunnel_refused", f"CONNECT {authority}: HTTP {status}")
        try:
            await conn.writer.start_tls(self.ssl_context, server_hostname=check.target.host)
        except (ssl.SSLError, OSError) as exc:
            raise ProbeError("tls_error", f"TLS with {authority}: {exc}") from exc


def _result(ok: bool, outcome: str, started: float, status: int, detail: str) -> ProbeResult:
    return ProbeResult(ok, outcome, (time.perf_counter() - started) * 1000.0, status, detail)


async def _read_head(reader: asyncio.StreamReader, *, reused: bool) -> Head:
    """The final head (1xx interim answers are skipped); ``_Stale`` when a reused connection
    was closed before a byte came."""
    while True:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if reused and not exc.partial:
                raise _Stale from exc
            raise
        except asyncio.LimitOverrunError as exc:
            raise ProbeError("protocol_error", "response head too large") from exc
        if len(raw) > _HEAD_LIMIT:
            raise ProbeError("protocol_error", "response head too large")
        try:
            head = parse_head(raw)
        except HttpRefused as exc:
            raise ProbeError("protocol_error", str(exc)) from exc
        if head.status >= 200:
            return head


async def _read_response(reader: asyncio.StreamReader, *, reused: bool) -> tuple[int, bool]:
    """The status and whether the connection may be reused; the body is read and dropped."""
    head = await _read_head(reader, reused=reused)
    status, keep = head.status, head.keep_alive
    if status in (204, 304):
        return status, keep
    if head.chunked:
        await _read_chunked(reader)
    elif head.length is not None:
        if head.length > _BODY_LIMIT:
            return status, False  # not worth reading: drop the connection instead
        await reader.readexactly(head.length)
    else:
        return status, False  # body until close: the answer is the status, the rest is moot
    return status, keep


async def _read_chunked(reader: asyncio.StreamReader, keep: int = 0) -> bytes:
    """Reads a chunked body through; returns its first ``keep`` bytes. Every size line is
    parsed strictly (``http1.chunk_size``): a negative or otherwise malformed one is a
    ``protocol_error``, as is a chunk not followed by its line end."""
    kept = bytearray()
    total = 0
    try:
        while True:
            size = chunk_size(await reader.readuntil(b"\r\n"))
            total += size
            if total > _BODY_LIMIT:
                raise ProbeError("protocol_error", "response body too large")
            if size == 0:
                for _ in range(_MAX_TRAILERS):
                    if await reader.readuntil(b"\r\n") == b"\r\n":
                        return bytes(kept)
                raise ProbeError("protocol_error", "too many trailer lines")
            chunk = await reader.readexactly(size + 2)
            if chunk[-2:] != b"\r\n":
                raise ProbeError("protocol_error", "a chunk longer than its size")
            if len(kept) < keep:
                kept += chunk[: min(size, keep - len(kept))]
    except HttpRefused as exc:
        raise ProbeError("protocol_error", str(exc)) from exc
    except asyncio.LimitOverrunError as exc:
        raise ProbeError("protocol_error", "a chunk size line without its end") from exc
