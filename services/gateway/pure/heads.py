"""The heads the gateway reads and writes (docs/gateway.md, "What reaches the proxy").

A request is read by httptools (the shell); what to make of it is decided here: who logged in,
where it goes, and the head sent on to the leased proxy. That head carries the lease's login in
place of the crawler's, and none of the hop-by-hop headers or the gateway's own parameters: the
site sees what the crawler sent, as it would through the proxy directly.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

Header = tuple[bytes, bytes]

PARAMS_HEADER = b"x-egress-params"
"""The user name's parameters for a client that cannot put them in its proxy login."""
OWN_PREFIX = b"x-egress-"
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"proxy-connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"upgrade",
    }
)


class HeadError(ValueError):
    """A request the gateway will not relay; ``status`` is the answer (400, 403)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Target:
    """Where a request goes: its host (lower case, no brackets) and port."""

    host: str
    port: int
    scheme: str

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def login(headers: Sequence[Header]) -> tuple[str, str] | None:
    """The ``Proxy-Authorization: Basic`` user and password; ``None`` when absent or not Basic
    (an answer of 407 asks for it). Clients percent-decode a URL's user before sending it;
    some send it encoded, so a ``%`` escape is decoded here too."""
    value = _one(headers, b"proxy-authorization")
    if value is None:
        return None
    scheme, _, given = value.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(given.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    if not sep:
        return None
    return unquote(user), unquote(password)


def params(headers: Sequence[Header]) -> str:
    value = _one(headers, PARAMS_HEADER)
    return value.decode("ascii", "replace").strip() if value else ""


def target(method: str, url: bytes) -> Target:
    """The target of a proxy request: ``host:port`` for CONNECT, an absolute URL otherwise."""
    text = url.decode("ascii", "replace")
    if method == "CONNECT":
        parts = urlsplit(f"//{text}")
        if not parts.hostname or parts.port is None or parts.path or parts.username:
            raise HeadError(f"CONNECT needs host:port, got {text[:100]!r}")
        return Target(parts.hostname.lower(), parts.port, "https")
    if text.startswith("/"):
        raise HeadError(
            "this is a proxy: send the absolute URL (GET http://host/path), as an HTTP client "
            "configured with a proxy does"
        )
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise HeadError(f"the URL {text[:100]!r} cannot be read: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username:
        raise HeadError(f"only http:// and https:// URLs without a login, got {text[:100]!r}")
    default = 443 if parts.scheme == "https" else 80
    return Target(parts.hostname.lower(), port or default, parts.scheme)


def denied(target: Target, own_ports: Iterable[int]) -> str | None:
    """Why the gateway itself refuses ``target``, whatever the proxy's rules: never to itself,
    the discovery API or NATS (``own_ports``) on a local address. The proxies' own rules apply
    on top (docs/operations.md, "Security model")."""
    if target.port not in set(own_ports):
        return None
    if target.host == "localhost" or target.host.endswith(".localhost"):
        return f"{target.authority} is one of the gateway's own ports"
    try:
        address = ipaddress.ip_address(target.host)
    except ValueError:
        return None
    if address.is_loopback or address.is_unspecified or address.is_link_local:
        return f"{target.authority} is one of the gateway's own ports"
    return None


def upstream_head(
    method: bytes,
    url: bytes,
    version: bytes,
    headers: Iterable[Header],
    proxy_login: bytes | None,
    *,
    keep_alive: bool = True,
) -> bytes:
    """The request head for the leased proxy: the crawler's headers without the hop-by-hop
    ones, those ``Connection`` names, and ours; the lease's login instead of the crawler's.
    ``Connection`` says what the crawler asked (``keep_alive``): an HTTP/1.0 crawler's
    keep-alive must be asked for again, or the proxy closes after each answer."""
    headers = list(headers)
    named = {
        token.strip().lower()
        for value in (v for k, v in headers if k.lower() == b"connection")
        for token in value.split(b",")
    }
    lines = [b"%s %s HTTP/%s" % (method, url, version)]
    for key, value in headers:
        low = key.lower()
        if low in HOP_BY_HOP or low in named or low.startswith(OWN_PREFIX):
            continue
        lines.append(key + b": " + value)
    if proxy_login is not None:
        lines.append(b"Proxy-Authorization: Basic " + base64.b64encode(proxy_login))
    lines.append(b"Connection: keep-alive" if keep_alive else b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def connect_head(target: Target, proxy_login: bytes | None) -> bytes:
    lines = [f"CONNECT {target.authority} HTTP/1.1".encode(), f"Host: {target.authority}".encode()]
    if proxy_login is not None:
        lines.append(b"Proxy-Authorization: Basic " + base64.b64encode(proxy_login))
    return b"\r\n".join(lines) + b"\r\n\r\n"


def answer(status: int, reason: str, *, close: bool = True, extra: Sequence[Header] = ()) -> bytes:
    """A short answer of the gateway's own, its reason in the body and in ``X-Egress-Error``."""
    body = (reason + "\n").encode("utf-8", "replace")
    phrase = PHRASES.get(status, "Error")
    lines = [
        f"HTTP/1.1 {status} {phrase}".encode(),
        b"Content-Type: text/plain; charset=utf-8",
        b"Content-Length: " + str(len(body)).encode(),
        b"X-Egress-Error: " + _header_text(reason),
    ]
    if close:
        lines.append(b"Connection: close")
    lines += [k + b": " + v for k, v in extra]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


PHRASES = {
    200: "Connection established",
    400: "Bad Request",
    403: "Forbidden",
    407: "Proxy Authentication Required",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
CHALLENGE: Header = (b"Proxy-Authenticate", b'Basic realm="egress-proxies"')


def _one(headers: Sequence[Header], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _header_text(text: str) -> bytes:
    """A header value: printable ASCII, at most 300 characters."""
    cleaned = "".join(c if " " <= c <= "~" else "?" for c in text)
    return cleaned[:300].encode("ascii")
