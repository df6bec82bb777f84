"""A request's ``target`` checked strictly: a host name, or an http(s) URL whose host is one
(docs/decisions/0139-the-discovery-api-s-edges.md).

A target goes into the log (``LeaseReported.target``, ``LeaseAcquired.target``), the console and
the CLI show it, and its host keys the proxy's back-offs. ``xsshost<svg>.example`` names no host,
yet ``urlsplit`` hands it back as one, so the rule is written out here: labels of letters, digits
and inner hyphens (an internationalised label is checked by its IDNA form), 1 to 63 characters
each and 253 in all, the last not all digits; or an IPv4 address in dotted decimal, or an IPv6
address in brackets. A URL's path, query and fragment hold only the characters RFC 3986 allows
(others percent-encoded), and no user or password. Nothing is coerced: a target that breaks a
rule is refused with the rule, not repaired.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

MAX_HOST = 253
"""A host name's length at most (its ASCII form, without the trailing dot)."""
SHOWN = 100
"""Characters of a refused target quoted back at most."""
SCHEMES = ("http", "https")
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_ASCII_NAME = re.compile(
    r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z"
)
"""A whole ASCII host name of good labels: one match for the common case, before the label by
label check that names the bad one."""
_URI_CHARS = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*\Z")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*\Z")
HOW = "send a host name (shop.example.com) or an http(s) URL of one"


def check_target(text: str) -> str:
    """The host ``text`` names (what ``outcomes.target_key`` makes of it; "" for an empty
    target), or ValueError saying which rule it breaks; the caller names the field."""
    if not text.strip():
        return ""
    if not text.isprintable() or " " in text:  # every other space is not printable
        raise ValueError(f"{_shown(text)} holds a space or a control character; {HOW}")
    scheme, sep, _ = text.partition("://")
    if sep and (not _SCHEME.fullmatch(scheme) or scheme.lower() not in SCHEMES):
        raise ValueError(f"{_shown(text)}: a URL's scheme is http or https; {HOW}")
    try:
        parts = urlsplit(text if sep else f"//{text}")
    except ValueError:
        raise ValueError(
            f"{_shown(text)}: a '[' or ']' that encloses no IPv6 address; {HOW}"
        ) from None
    if "@" in parts.netloc:
        raise ValueError(f"{_shown(text)}: a user or password in a target is refused; {HOW}")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError:
        raise ValueError(f"{_shown(text)}: the port is a number from 0 to 65535; {HOW}") from None
    rest = text[len(scheme) + len(sep) :] if sep else text
    after_host = rest[len(parts.netloc) :]
    if not _URI_CHARS.fullmatch(after_host):
        raise ValueError(
            f"{_shown(text)}: a path, query or fragment holds a character a URL does not allow "
            f"(percent-encode it); {HOW}"
        )
    host = parts.hostname or ""
    _check_host(parts.netloc, host, text)
    return host[:-1] if host.endswith(".") else host  # as ``target_key`` has it


def _shown(text: str) -> str:
    """The refused target as a message quotes it: made only for a refusal."""
    return repr(text[:SHOWN]) + ("..." if len(text) > SHOWN else "")


def _check_host(netloc: str, host: str, text: str) -> None:
    if netloc.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(
                f"{_shown(text)}: {host[:SHOWN]!r} is no IPv6 address; {HOW}"
            ) from None
        return
    name = host[:-1] if host.endswith(".") else host
    if not name:
        raise ValueError(f"{_shown(text)} names no host; {HOW}")
    if name.replace(".", "").isdigit():  # digits and dots only: an IPv4 address or nothing
        try:
            ipaddress.IPv4Address(name)
        except ValueError:
            raise ValueError(
                f"{_shown(text)}: {name[:SHOWN]!r} is no IPv4 address (four numbers 0-255, no "
                f"leading zeros); {HOW}"
            ) from None
        return
    if name.isascii() and _ASCII_NAME.match(name):
        labels = name.rsplit(".", 1)[-1:]
        ascii_name = name
    else:
        labels = [_ascii_label(label, text) for label in name.split(".")]
        ascii_name = ".".join(labels)
    if len(ascii_name) > MAX_HOST:
        raise ValueError(f"{_shown(text)}: a host name is at most {MAX_HOST} characters; {HOW}")
    if labels[-1].isdigit():
        raise ValueError(f"{_shown(text)}: a host name's last label is not all digits; {HOW}")


def _ascii_label(label: str, text: str) -> str:
    """The label's ASCII form, or ValueError: letters, digits and inner hyphens, 1-63."""
    if not label.isascii():
        try:
            label = label.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError(
                f"{_shown(text)}: {label[:SHOWN]!r} is no internationalised host label; {HOW}"
            ) from None
    if not _LABEL.fullmatch(label):
        raise ValueError(
            f"{_shown(text)} names no host: the label {label[:SHOWN]!r} is not 1-63 letters, "
            f"digits or inner hyphens; {HOW}"
        )
    return label
