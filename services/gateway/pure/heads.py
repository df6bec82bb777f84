"""The heads the gateway reads and writes (docs/gateway.md, "What reaches the proxy").

A request is read by httptools (the shell); what to make of it is decided here: who logged in,
where it goes, and the head sent on to the leased proxy. That head carries the lease's login in
place of the crawler's, and none of the hop-by-hop headers or the gateway's own parameters: the
site sees what the crawler sent, as it would through the proxy directly.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
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
        try:
            parts = urlsplit(f"//{text}")
            port = parts.port
        except ValueError:
            port = None
            parts = urlsplit("//")
        if not parts.hostname or not port or parts.path or parts.query or parts.username:
            raise HeadError(f"CONNECT needs host:port (a port from 1 to 65535), got {text[:100]!r}")
        return Target(parts.hostname.lower(), port, "https")
    if text.startswith("/") or text == "*":
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
    if port == 0:
        raise HeadError(f"port 0 cannot be reached, got {text[:100]!r}")
    default = 443 if parts.scheme == "https" else 80
    return Target(parts.hostname.lower(), port or default, parts.scheme)


def authority_end(url: bytes) -> int:
    """Where an absolute URL's scheme and authority end (its path, query or fragment starts),
    as ``urlsplit`` reads them: two URLs alike up to there have the same ``target``. The whole
    length when there is no ``//`` (a CONNECT's ``host:port``)."""
    start = url.find(b"//")
    if start < 0:
        return len(url)
    end = len(url)
    for mark in (b"/", b"?", b"#"):
        found = url.find(mark, start + 2, end)
        if found >= 0:
            end = found
    return end


def denied(target: Target, own_ports: Iterable[int]) -> str | None:
    """Why the gateway itself refuses ``target``, whatever the proxy's rules: never to itself,
    the discovery API or NATS (``own_ports``) on a local address, however it is spelled
    (``localhost.``, ``127.1``, ``0x7f000001``, ``::ffff:127.0.0.1``, ``0``: the forms a
    resolver reads as an address). A name that resolves to a local address elsewhere is the
    proxies' to refuse: their own rules apply on top (docs/operations.md, "Security model";
    docs/decisions/0156-the-gateway-s-edges.md)."""
    if target.port not in set(own_ports):
        return None
    host = target.host.removesuffix(".")
    if host == "localhost" or host.endswith(".localhost"):
        return f"{target.authority} is one of the gateway's own ports"
    address = _address(host)
    if address is None:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback or address.is_unspecified or address.is_link_local:
        return f"{target.authority} is one of the gateway's own ports"
    return None


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an address, in the forms ``inet_aton`` reads too (one to four parts, each
    decimal, octal with a leading 0 or hex with 0x): a resolver connects to ``127.1``."""
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host.partition("%")[0])
    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    numbers: list[int] = []
    for part in parts:
        try:
            if part[:2].lower() == "0x":
                numbers.append(int(part[2:] or "0", 16))
            elif len(part) > 1 and part.startswith("0"):
                numbers.append(int(part, 8))
            else:
                numbers.append(int(part, 10) if part.isascii() and part.isdigit() else -1)
        except ValueError:
            return None
    *head, last = numbers
    if any(not 0 <= n <= 255 for n in head) or not 0 <= last < 256 ** (5 - len(numbers)):
        return None
    value = last
    for i, n in enumerate(head):
        value |= n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


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
        if low in HOP_BY_HOP or low in named or low.startswith(OWN_PREFIX) or low == b"expect":
            continue  # Expect: the gateway answered the 100 and sends the body with the head
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
    408: "Request Timeout",
    411: "Length Required",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
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
