"""Reading an HTTP/1.1 message with httptools, bounded (docs/gateway.md, "Limits").

The request head is read whole (at most ``MAX_HEAD`` bytes, within ``head_timeout``: a slowloris
costs its own connection, nothing more) and parsed by llhttp, which refuses what a proxy must not
guess about: ``Content-Length`` with ``Transfer-Encoding``, two different ``Content-Length``\\ s,
bytes that are not HTTP. A response is fed to the parser as it arrives, only to learn its status
and where it ends; its bytes go on to the crawler as they came.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httptools

from services.gateway.pure.heads import Header, HeadError

MAX_HEAD = 32 * 1024
MAX_HEADERS = 128
CHUNK = 64 * 1024


@dataclass
class Request:
    method: str = ""
    url: bytes = b""
    version: bytes = b"1.1"
    headers: list[Header] = field(default_factory=list)
    keep_alive: bool = True
    chunked: bool = False
    length: int = 0

    parser: httptools.HttpRequestParser | None = None

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_headers_complete(self) -> None:
        # Read here: llhttp forgets a message's flags once it completes, which a bodiless
        # request does with its head.
        if self.parser is not None:
            self.keep_alive = self.parser.should_keep_alive()

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_HEADERS:
            raise HeadError(f"more than {MAX_HEADERS} header fields", 431)
        self.headers.append((name, value))


async def read_request(reader: asyncio.StreamReader, timeout: float) -> Request | None:
    """The next request's head; ``None`` when the client closed between requests."""
    try:
        async with asyncio.timeout(timeout):
            raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise HeadError("the request head ended before its blank line") from None
    except asyncio.LimitOverrunError:
        raise HeadError(f"the request head is longer than {MAX_HEAD} bytes", 431) from None
    except TimeoutError:
        raise HeadError(f"no whole request head within {timeout:g} s", 408) from None
    request = Request()
    parser = httptools.HttpRequestParser(request)
    request.parser = parser
    try:
        parser.feed_data(raw)
    except httptools.HttpParserUpgrade:
        pass  # CONNECT: the head is whole, what follows is the tunnel's
    except httptools.HttpParserError as exc:
        raise HeadError(f"this is not a request the gateway can read: {exc}") from None
    request.method = parser.get_method().decode("ascii", "replace")
    request.version = parser.get_http_version().encode("ascii")
    lengths = [v for k, v in request.headers if k.lower() == b"content-length"]
    codings = b",".join(v for k, v in request.headers if k.lower() == b"transfer-encoding")
    request.chunked = b"chunked" in codings.lower()
    if lengths and not request.chunked:
        request.length = int(lengths[0].strip())
    return request


class Response:
    """What the gateway learns of a response while its bytes pass: the status, whether Squid
    made it (``X-Squid-Error``), and when it is complete."""

    def __init__(self, head_only: bool) -> None:
        self.status = 0
        self.squid_error = False
        self.headers_done = False
        self.complete = False
        self.head_only = head_only
        self.keep_alive = False
        self._parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"x-squid-error":
            self.squid_error = True

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        if self.head_only or self.status in (204, 304) or 100 <= self.status < 200:
            self.complete = self.status >= 200

    def on_message_complete(self) -> None:
        self.complete = True

    def feed(self, data: bytes) -> None:
        if self.complete:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise HeadError(f"the proxy answered something unreadable: {exc}", 502) from None
