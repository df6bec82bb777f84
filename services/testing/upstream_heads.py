"""The heads the fake proxy service (``upstream_server``) writes: its own short answers, a
plain text reason as the body as the services answer (a 407 with the challenge a client needs
to send its login), and the request head it sends a site: origin form, without the hop-by-hop
headers and the proxy login, on a connection of its own. A client's ``Expect: 100-continue`` is
answered by the service itself and not passed on: the body is read whole before the site's
answer, so a site's ``100 Continue`` would be taken for its answer."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from services.gateway.pure import heads
from services.gateway.pure.heads import Target
from services.gateway.reading import Request

PHRASES = {
    200: "OK",
    201: "Created",
    400: "Bad Request",
    402: "Payment Required",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    407: "Proxy Authentication Required",
    408: "Request Timeout",
    409: "Conflict",
    411: "Length Required",
    413: "Content Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
CHALLENGE = (b"Proxy-Authenticate", b'Basic realm="upstream-service"')


def answer(status: int, reason: str, extra: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
    """A short answer of the service's own, its reason as the plain text body."""
    body = (reason + "\n").encode("utf-8", "replace")
    lines = [
        f"HTTP/1.1 {status} {PHRASES.get(status, 'Error')}".encode(),
        b"Content-Type: text/plain; charset=utf-8",
        b"Content-Length: " + str(len(body)).encode(),
        b"Connection: close",
        *(k + b": " + v for k, v in extra),
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def origin_head(request: Request, target: Target) -> bytes:
    """The request head for the site: origin form, without the hop-by-hop headers and the
    proxy login, ``Host`` as the client sent it (or the target's), on a connection of its own."""
    parts = urlsplit(request.url.decode("ascii", "replace"))
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    named = {
        token.strip().lower()
        for value in (v for k, v in request.headers if k.lower() == b"connection")
        for token in value.split(b",")
    }
    lines = [f"{request.method} {path} HTTP/1.1".encode("ascii", "replace")]
    if not any(k.lower() == b"host" for k, _ in request.headers):
        lines.append(b"Host: " + target.authority.encode("ascii", "replace"))
    for key, value in request.headers:
        low = key.lower()
        if low in heads.HOP_BY_HOP or low in named or low.startswith(b"proxy-") or low == b"expect":
            continue
        lines.append(key + b": " + value)
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def expects_continue(request: Request) -> bool:
    """Whether the client waits for ``100 Continue`` before it sends its body."""
    return any(
        k.lower() == b"expect" and v.strip().lower() == b"100-continue" for k, v in request.headers
    )
