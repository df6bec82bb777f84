"""The answer of an echo URL, read: which public address the proxy's traffic leaves from.

Pure: the health service fetches the echo URL through each proxy and hands the status, the
content type and the body (at most ``ECHO_BODY_LIMIT + 1`` bytes, so an oversized answer is
recognised) to ``parse_echo``. Why a verdict instead of an exception: the body comes from a
server on the other side of the proxy, so it is hostile input, and a bad answer is a fact about
the configured URL that the operator must read (``error``: one line, what was wrong and the fix),
not a crash of the checker.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import TypeAlias

ECHO_BODY_LIMIT = 4096
"""Bytes: an address in any form the parser accepts fits many times over; more is a page."""

SCOPE_PUBLIC = "public"
SCOPE_PRIVATE = "private"

FIX = "set --egress-echo-url (or spec.egressCheck.url) to a URL that answers the caller's address"
"""The remedy every refusal ends with: all of them mean the URL is not an address echo."""

# The documentation ranges (RFC 5737, RFC 3849) are reserved, but the tests stand them in for
# public addresses (a test cannot own a real one), so they count as public here: nothing on a
# real network answers from them, so treating them as public hides no real private egress.
_DOCUMENTATION = (
    ipaddress.ip_network("192.0.2.0/24"),
    ipaddress.ip_network("198.51.100.0/24"),
    ipaddress.ip_network("203.0.113.0/24"),
    ipaddress.ip_network("2001:db8::/32"),
)
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_QUOTE = 40
"""Characters of a refused body quoted in the error, enough to recognise it."""

_JSON_KINDS: dict[type, str] = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}

Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class EchoAnswer:
    """``ip`` (normalised) and ``scope`` when the answer is an address, else ``error``."""

    ip: str = ""
    scope: str = ""
    error: str = ""


def scope_of(address: Address) -> str:
    """``"public"`` for an address the internet routes to (documentation ranges included, see
    above), ``"private"`` for everything an egress cannot be seen from: private, loopback,
    link-local, site-local, reserved, multicast, unspecified, shared (100.64/10)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if any(address in network for network in _DOCUMENTATION):
        return SCOPE_PUBLIC
    local = (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_reserved
        or address.is_multicast
        or address.is_unspecified
        or (isinstance(address, ipaddress.IPv6Address) and address.is_site_local)
        or (isinstance(address, ipaddress.IPv4Address) and address in _SHARED)
    )
    return SCOPE_PRIVATE if local or not address.is_global else SCOPE_PUBLIC


def parse_address(text: str) -> Address | str:
    """The address ``text`` holds (an IPv4-mapped IPv6 address reduced to IPv4), or a refusal
    naming what is wrong with it. Shared with the geo lookup so both read addresses alike."""
    if "%" in text:
        return f"{_quote(text)}, an address with a zone (%...), which no public address has"
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        if _has_port(text):
            return f"{_quote(text)}, an address with a port"
        return f"{_quote(text)}, which is not an IP address"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_echo(status: int, content_type: str, body: bytes) -> EchoAnswer:
    """Never raises: every answer is an address or a one-line error ending with the fix."""
    if not 200 <= status <= 299:
        return _refuse(f"the echo URL answered HTTP {status}")
    if len(body) > ECHO_BODY_LIMIT:
        return _refuse(
            f"the echo URL answered more than {ECHO_BODY_LIMIT} bytes, a page rather than "
            "an address"
        )
    try:
        text = body.decode("utf-8-sig").strip()
    except UnicodeDecodeError:
        return _refuse("the echo URL answered bytes that are not UTF-8 text")
    if not text:
        return _refuse("the echo URL answered an empty body")
    media = content_type.split(";", 1)[0].strip().lower()
    if "html" in media or text.startswith("<"):
        return _refuse("the echo URL answered an HTML page, not an address")
    if "json" in media or text.startswith("{"):
        found, refusal = _from_json(text)
    elif any(c.isspace() for c in text):
        found, refusal = "", f"the echo URL answered more than one word ({_quote(text)})"
    else:
        found, refusal = text, ""
    if refusal:
        return _refuse(refusal)
    parsed = parse_address(found)
    if isinstance(parsed, str):
        return _refuse(f"the echo URL answered {parsed}")
    return EchoAnswer(ip=str(parsed), scope=scope_of(parsed))


def _from_json(text: str) -> tuple[str, str]:
    """The address text of a JSON answer and "", or "" and the refusal."""
    try:
        value = json.loads(text)
    except ValueError:
        return "", f"the echo URL answered invalid JSON ({_quote(text)})"
    except RecursionError:
        return "", "the echo URL answered JSON nested too deep to hold an address"
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), "value")
        return "", f'the echo URL answered a JSON {kind}, not an object with "ip"'
    for key in ("ip", "origin"):
        found = value.get(key)
        if isinstance(found, str):
            # httpbin's "origin" lists every hop, the caller first: "a, b".
            return (found.split(",", 1)[0] if key == "origin" else found).strip(), ""
        if found is not None:
            return "", f'the echo URL answered JSON whose "{key}" is not a string'
    return "", 'the echo URL answered a JSON object without "ip" (or "origin")'


def _has_port(text: str) -> bool:
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or not port.isascii():
        return False
    host = host.removeprefix("[").removesuffix("]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _quote(text: str) -> str:
    """A hostile string made safe for a one-line message: escaped and shortened."""
    shown = text if len(text) <= _QUOTE else text[:_QUOTE] + "..."
    return repr(shown)


def _refuse(what: str) -> EchoAnswer:
    return EchoAnswer(error=f"{what}; {FIX}")
