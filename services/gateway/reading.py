"""Reading an HTTP/1.1 message with httptools, bounded (docs/gateway.md, "Limits";
docs/decisions/0156-the-gateway-s-edges.md).

The request head is read whole (at most ``MAX_HEAD`` bytes and ``MAX_HEADERS`` fields, within
``head_timeout``: a slowloris costs its own connection, nothing more), its request line first:
one ending in a bare LF is refused at once, not waited on until the timeout. The whole head is
then parsed by llhttp, which refuses what a proxy must not guess about: ``Content-Length`` with
``Transfer-Encoding``, two ``Content-Length``\\ s, a length that is not a number, obs-fold, bytes
that are not HTTP. A response is fed to the parser as it arrives, only to learn its status and
where it ends; its bytes go on to the crawler as they came.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httptools

from services.gateway.pure import heads
from services.gateway.pure.heads import Header, HeadError

MAX_HEAD = 32 * 1024
MAX_HEADERS = 128
CHUNK = 64 * 1024
MAX_BLANK = 4
VERSIONS = (b"1.1", b"1.0")
NOTED = frozenset(
    {
        b"content-length",
        b"transfer-encoding",
        b"expect",
        b"proxy-authorization",
        heads.PARAMS_HEADER,
    }
)
"""The fields ``Request.on_header`` notes beside keeping them."""


@dataclass
class Request:
    method: str = ""
    url: bytes = b""
    version: bytes = b"1.1"
    headers: list[Header] = field(default_factory=list)
    keep_alive: bool = True
    chunked: bool = False
    length: int = 0
    parser: Any = None
    lengths: list[bytes] = field(default_factory=list)
    codings: bytes = b""
    login: bytes | None = None
    """The first ``Proxy-Authorization``, as sent."""
    params: bytes | None = None
    """The first ``X-Egress-Params``, as sent."""
    expects_continue: bool = False
    """``Expect: 100-continue``: the crawler waits for a 100 before it sends the body."""

    def upstream_head(self, login: bytes | None) -> bytes:
        """This request's head as the leased proxy gets it (``heads.upstream_head``), for both
        ways a request is sent: the callbacks' and the coroutine's."""
        return heads.upstream_head(
            self.method.encode(), self.url, self.version, self.headers, login,
            keep_alive=self.keep_alive,
        )  # fmt: skip

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_HEADERS:
            raise HeadError(f"more than {MAX_HEADERS} header fields", 431)
        self.headers.append((name, value))
        low = name.lower()
        if low not in NOTED:
            return  # most fields: one lookup, not a test per name below
        if low == b"content-length":
            self.lengths.append(value)
        elif low == b"transfer-encoding":
            self.codings = self.codings + b"," + value if self.codings else value
        elif low == b"expect":
            self.expects_continue = value.strip().lower() == b"100-continue"
        elif low == b"proxy-authorization":
            if self.login is None:
                self.login = value
        elif low == heads.PARAMS_HEADER and self.params is None:
            self.params = value

    def on_headers_complete(self) -> None:
        # Asked here, not after feed_data: once a request without a body is complete, llhttp
        # has reset its flags for the next one and ``Connection: close`` is forgotten.
        self.keep_alive = self.parser.should_keep_alive()
        self.version = self.parser.get_http_version().encode("ascii", "replace")


def take_head(buffer: bytearray, *, eof: bool = False) -> bytes | None:
    """The next request head's bytes up to its blank line, taken from ``buffer``; ``None`` while
    more must come, ``b""`` when the client closed between requests (``eof`` after nothing but
    blank lines). The request line is judged as soon as it is whole, so that one ending in a
    bare LF is refused at once instead of waited on (a CRLFCRLF that never comes); a few empty
    lines before it are skipped (RFC 9112, 2.2)."""
    pos = 0
    for _ in range(MAX_BLANK + 1):
        end = buffer.find(b"\n", pos)
        if end < 0:
            return _more(buffer, eof)
        if buffer[pos : end + 1] != b"\r\n":
            break
        pos = end + 1
    else:
        raise HeadError("only empty lines where a request line belongs")
    if end == pos or buffer[end - 1] != 13:  # 13: CR
        raise HeadError("the request line ends in a bare LF; end each line of the head with CRLF")
    start = end + 1
    if len(buffer) < start + 2:
        return _more(buffer, eof)
    two = buffer[start : start + 2]
    if two == b"\r\n":
        end = start + 2
    else:
        if b"\n" in two or two.endswith(b"\r"):
            raise HeadError("a header field line ends too soon; end each line with CRLF")
        found = buffer.find(b"\r\n\r\n", start)
        if found < 0:
            return _more(buffer, eof)
        end = found + 4
    if end - pos > MAX_HEAD:
        raise HeadError(f"the request head is longer than {MAX_HEAD} bytes", 431)
    head = bytes(buffer[pos:end])  # without the empty lines before it
    del buffer[:end]
    return head


def _more(buffer: bytearray, eof: bool) -> bytes | None:
    if len(buffer) > MAX_HEAD:
        raise HeadError(f"the request head is longer than {MAX_HEAD} bytes", 431)
    if not eof:
        return None
    if buffer.strip():
        raise HeadError("the request head ended before its blank line")
    buffer.clear()
    return b""


def parse_request(raw: bytes) -> Request:
    """A whole head (``take_head``), read by llhttp."""
    request = Request()
    parser = request.parser = httptools.HttpRequestParser(request)
    try:
        parser.feed_data(raw)
    except httptools.HttpParserUpgrade:
        pass  # CONNECT: the head is whole, what follows is the tunnel's
    except httptools.HttpParserCallbackError as exc:
        cause = exc.__context__
        if isinstance(cause, HeadError):
            raise cause from None
        raise HeadError(f"this is not a request the gateway can read: {exc}") from None
    except httptools.HttpParserError as exc:
        raise HeadError(f"this is not a request the gateway can read: {exc}") from None
    if request.version not in VERSIONS:
        version = request.version.decode("ascii", "replace")
        raise HeadError(f"HTTP/{version} is not spoken here: HTTP/1.1 or HTTP/1.0", 505)
    request.method = parser.get_method().decode("ascii", "replace")
    request.chunked = b"chunked" in request.codings.lower()
    if request.lengths and not request.chunked:
        request.length = int(request.lengths[0].strip())  # llhttp let one plain number through
    return request


def final_part(seen: bytes, interims: int) -> bytes:
    """The bytes of an answer from its final head on: without the ``interims`` interim heads
    (1xx, no body) that came before it."""
    for _ in range(interims):
        end = seen.find(b"\r\n\r\n")
        if end < 0:
            break
        seen = seen[end + 4 :]
    return seen


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
        self.interims = 0
        """Interim answers (1xx) before this one: their heads lead the bytes read."""
        self._interim = False
        self._parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"x-squid-error":
            self.squid_error = True

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self._interim = True  # a 100 Continue, a 103 Early Hints: the answer comes after
            return
        self.headers_done = True
        self.status = status
        self.keep_alive = self._parser.should_keep_alive()
        if self.head_only or self.status in (204, 304):
            self.complete = True

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            self.interims += 1
            return
        self.complete = True

    def feed(self, data: bytes) -> None:
        if self.complete:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise HeadError(f"the proxy answered something unreadable: {exc}", 502) from None
