"""The proxy login's user name: who is asking, and what for (docs/gateway.md, "User names").

``crawler-a-country-de-session-s1`` is the client ``crawler-a`` asking for a proxy whose
attribute ``country`` is ``de``, in the sticky session ``s1``. The commercial gateways crawlers
already use put their parameters in the user name the same way (``user-country-de-session-abc``),
so every HTTP client that can send a proxy login can send them: curl, requests, Scrapy's
``HTTPPROXY``, a browser's proxy credentials.

The client's name is known before the grammar is read: the password is its token, and the token
names the client, so the name is a prefix, not something to guess among the segments (client
names contain hyphens). After it come ``key-value`` pairs separated by ``-``; a hyphen inside a
key or value is written twice (``tier-eu--west`` is ``tier: eu-west``), since attribute keys and
values may contain one. Reserved keys: ``session``, ``ttl``, ``pool``; every other key is a
selector attribute, including ``egress.country`` and ``egress.asn``.

Pure, and total: any text in, an ``Ask`` or a ``UserNameError`` naming what is wrong out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_USER = 1024
"""A user name longer than this is refused before it is read."""
MAX_PAIRS = 32
SESSION = "session"
TTL = "ttl"
POOL = "pool"
RESERVED = (SESSION, TTL, POOL)
MAX_TTL = 86_400
"""A session idle longer than a day is over: a gateway session is for a crawl, not a tenancy."""

_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?\Z")
"""A selector attribute's key, as a Proxy's ``spec.attributes`` allows it."""
_EGRESS_KEYS = ("egress.country", "egress.asn")
_SESSION = re.compile(r"[A-Za-z0-9._~]{1,128}\Z")
_VALUE = re.compile(r"[\x21-\x7e]{1,256}\Z")
"""A selector value: printable ASCII without spaces (a proxy login cannot carry more safely)."""
_POOL = re.compile(r"([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
FIX = 'see docs/gateway.md, "User names"'


class UserNameError(ValueError):
    """The user name cannot be used; the message says which part and the rule (the gateway
    answers 407 with it)."""


@dataclass(frozen=True, slots=True)
class Ask:
    """What a request asks of the fleet."""

    selector: Mapping[str, str] = field(default_factory=dict)
    pool: str | None = None
    """``NAMESPACE/NAME``, or ``NAME`` in the namespace ``default`` (docs/api.md, "Pools")."""
    session: str | None = None
    """The sticky session's id, within the client: the same id from two clients is two
    sessions."""
    ttl: int | None = None
    """Seconds a session lives unused (its lease's TTL, renewed while it is used)."""

    _key: tuple[object, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Made once: every rotating request looks its leases up by it.
        object.__setattr__(self, "_key", (tuple(sorted(self.selector.items())), self.pool))

    def key(self) -> tuple[object, ...]:
        """What makes two requests share leases: the same selector and pool."""
        return self._key


def parse(user: str, client: str | None) -> tuple[str, Ask]:
    """The client's label and what it asks. ``client`` is the name the token identified: the
    user name must be it, or it followed by ``-`` and parameters. Without one (a gateway open to
    all, ``--insecure-open``) the label is the user name's first segment."""
    if len(user) > MAX_USER:
        raise UserNameError(f"user name: longer than {MAX_USER} characters; {FIX}")
    if client is not None:
        if user == client:
            return client, Ask()
        if not user.startswith(client + "-"):
            raise UserNameError(
                f"user name: must start with the client's name {client!r} (the token belongs "
                f"to {client!r}), then -key-value pairs; {FIX}"
            )
        return client, parse_params(user[len(client) + 1 :])
    segments = _segments(user)
    return segments[0], _ask(segments[1:])


def parse_params(text: str) -> Ask:
    """``key-value`` pairs, as after the client's name or in the ``X-Egress-Params`` header."""
    if not text:
        return Ask()
    if len(text) > MAX_USER:
        raise UserNameError(f"parameters: longer than {MAX_USER} characters; {FIX}")
    return _ask(_segments(text))


def _segments(text: str) -> list[str]:
    """Split on ``-``; ``--`` is a hyphen inside a segment. An empty segment is an error."""
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "-" and text[i + 1 : i + 2] == "-":
            current.append("-")
            i += 2
            continue
        if ch == "-":
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    if any(not part for part in parts):
        raise UserNameError(f"user name: an empty part (a leading or trailing '-'); {FIX}")
    return parts


def _ask(segments: list[str]) -> Ask:
    if len(segments) % 2:
        raise UserNameError(
            f"user name: {segments[-1]!r} has no value; parameters are key-value pairs "
            f"(country-de, session-s1); {FIX}"
        )
    if len(segments) // 2 > MAX_PAIRS:
        raise UserNameError(f"user name: more than {MAX_PAIRS} parameters; {FIX}")
    seen: dict[str, str] = {}
    for key, value in zip(segments[::2], segments[1::2], strict=True):
        if key in seen:
            raise UserNameError(f"user name: {key!r} is given twice; {FIX}")
        seen[key] = value
    selector: dict[str, str] = {}
    for key, value in seen.items():
        if key in RESERVED:
            continue
        if not (_KEY.match(key) or key in _EGRESS_KEYS):
            raise UserNameError(
                f"user name: {key!r} is neither session, ttl, pool nor an attribute key "
                f"(letters, digits, '.', '_', '/', '-' inside); {FIX}"
            )
        if not _VALUE.match(value):
            raise UserNameError(
                f"user name: the value of {key!r} must be 1 to 256 printable characters; {FIX}"
            )
        selector[key] = value
    return Ask(
        selector=selector,
        pool=_pool(seen.get(POOL)),
        session=_session(seen.get(SESSION)),
        ttl=_ttl(seen.get(TTL)),
    )


def _pool(value: str | None) -> str | None:
    if value is None:
        return None
    if not _POOL.match(value):
        raise UserNameError(
            f"user name: pool {value!r} must be NAMESPACE/NAME or NAME (DNS labels; write the "
            f"'/' as %2F in a proxy URL); {FIX}"
        )
    return value if "/" in value else f"default/{value}"


def _session(value: str | None) -> str | None:
    if value is None:
        return None
    if not _SESSION.match(value):
        raise UserNameError(
            f"user name: session {value!r} must be 1 to 128 letters, digits, '.', '_' or '~'; {FIX}"
        )
    return value


def _ttl(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_TTL:
        raise UserNameError(
            f"user name: ttl {value!r} must be whole seconds, 1 to {MAX_TTL}; {FIX}"
        )
    return int(value)
