"""What the debug wire log may show of a Compute request or response (pure, no I/O).

Two rules, in this order: secrets never appear (credential headers, secret-named fields, anything
shaped like a bearer token, an OAuth access token or a JWT, wherever it hides: a header, a query
string, a cloud-init script), and string fields over 1 KiB are elided unless
``--gcp-wire-log-full-payloads`` is set: a cloud-init script repeated in every create would drown
the log, but an operator chasing a bad one can ask for it.

The flag is process-wide (it is a property of how the operator runs the service, like the log
level), set once when the command line is parsed; a provider may override it for tests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

LIMIT = 1024
REDACTED = "<redacted>"

_SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-goog-iam-authorization-token",
        "x-goog-api-key",
        "x-goog-user-project-token",
    }
)
_SECRET_KEYS = frozenset(
    {
        "accesstoken",
        "idtoken",
        "refreshtoken",
        "token",
        "clientsecret",
        "privatekey",
        "password",
        "assertion",
        "authorization",
    }
)
_PATTERNS = (
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]+"),
    # A JWT: three base64url parts, the first a JSON header ({" -> eyJ).
    re.compile(r"eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"),
    # Google OAuth 2 access tokens.
    re.compile(r"\bya29\.[A-Za-z0-9._-]+"),
    re.compile(r"(?i)\b((?:access_?token|id_?token|api_?key|key|token)=)[^&\s\"']+"),
)

_settings = {"full_payloads": False}


def set_full_payloads(value: bool) -> None:
    _settings["full_payloads"] = value


def full_payloads() -> bool:
    return _settings["full_payloads"]


def scrub(text: str) -> str:
    """``text`` with every token-shaped substring replaced by ``<redacted>``."""
    for pattern in _PATTERNS:
        text = pattern.sub(_replacement, text)
    return text


def _replacement(match: re.Match[str]) -> str:
    # Keep a query parameter's name ("key=") so the line still says what was sent.
    prefix = match.group(1) if match.re.groups else ""
    return f"{prefix}{REDACTED}"


def headers(values: Mapping[str, str]) -> dict[str, str]:
    return {
        name: REDACTED if name.lower() in _SECRET_HEADERS else scrub(str(value))
        for name, value in values.items()
    }


def payload(body: bytes | str | None, *, full: bool) -> object:
    """A JSON body as a structure with long strings elided; anything else as (elided) text."""
    if not body:
        return None
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    try:
        decoded = json.loads(text)
    except ValueError:
        return _string(text, full)
    return _walk(decoded, full)


def _walk(value: object, full: bool) -> object:
    if isinstance(value, dict):
        return {
            key: REDACTED if _secret_key(key) else _walk(item, full) for key, item in value.items()
        }
    if isinstance(value, list):
        return [_walk(item, full) for item in value]
    if isinstance(value, str):
        return _string(value, full)
    return value


def _secret_key(key: object) -> bool:
    return isinstance(key, str) and key.replace("_", "").replace("-", "").lower() in _SECRET_KEYS


def _string(value: str, full: bool) -> str:
    size = len(value.encode())
    if not full and size > LIMIT:
        return f"<elided {size} bytes>"
    return scrub(value)
