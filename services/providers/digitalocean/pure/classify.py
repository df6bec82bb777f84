"""DigitalOcean's answers into the taxonomy: a pure table, tested row by row
(docs/architecture.md, The provider contract).

The inputs are what every error answer carries: the HTTP status, DigitalOcean's error ``id``
(``unprocessable_entity``, ``too_many_requests``, ``not_found``, ``Unauthorized``...) and its
``message``. DigitalOcean answers most refusals with 422 ``unprocessable_entity``, so the message
decides: the account's droplet limit is QuotaExceeded (retry slowly, say why), a droplet busy with
another action is Transient, anything else (an invalid size, an unavailable region, an unknown
image) is Permanent with DigitalOcean's words.

How long to wait comes from the headers: ``Retry-After`` (seconds, or an HTTP date) when given,
else ``ratelimit-reset`` (a Unix time: when the hourly budget is back).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC
from email.utils import parsedate_to_datetime

from services.providers.base import (
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)

QUOTA_PHRASES = (
    "droplet limit",
    "exceed your",
    "limit reached",
    "reached the limit",
    "reached your",
    "capacity",
    "currently unavailable",
)
"""How DigitalOcean words a refusal for the account's limits ("creating this/these droplet(s)
will exceed your droplet limit") or a region out of stock: both pass with time, not a new spec."""
BUSY_PHRASES = ("pending event", "pending action", "is locked")
"""A droplet busy with another action: the same call succeeds a moment later."""
TRANSIENT_STATUSES = frozenset({408, 409, 423, 425, 429})
THROTTLED = "too_many_requests"
BURST_WAIT = 60.0
READ_OPS = frozenset({"get", "delete"})
"""Calls that name an existing resource: a 404 is its absence, not a bad spec."""

AUTH_FIX = (
    "check DIGITALOCEAN_TOKEN (or the entry's tokenFile): the token must be valid and allowed to "
    "read and write droplets, firewalls and tags"
)
FIELDS = (
    ("size", "size"),
    ("region", "region"),
    ("image", "image"),
    ("vpc", "vpcUuid"),
    ("ssh", "sshKeys"),
    ("user data", "user data"),
    ("user_data", "user data"),
)


def classify(status: int, error_id: str, message: str, *, op: str = "") -> type[ProviderError]:
    """The class for a failed call ``op`` (create, get, delete, list, firewall, tag)."""
    text = message.lower()
    if is_throttled(status, error_id):
        return Transient
    if status in (401, 403):
        return Permanent
    if status == 404:
        return NotFound if op in READ_OPS else Permanent
    if any(phrase in text for phrase in QUOTA_PHRASES):
        return QuotaExceeded
    if any(phrase in text for phrase in BUSY_PHRASES) or status in TRANSIENT_STATUSES:
        return Transient
    if status >= 500:
        return Transient
    if 400 <= status < 500:
        return Permanent
    # 1xx-3xx as an error: something between us and the API misbehaved.
    return Transient


def field_of(message: str) -> str:
    """The config or placement field a 422 is about ("You specified an invalid size"), or ""."""
    text = message.lower()
    return next((field for word, field in FIELDS if word in text), "")


def is_throttled(status: int, error_id: str) -> bool:
    return status == 429 or error_id.lower() == THROTTLED


def retry_after(headers: Mapping[str, str], now: float, *, throttled: bool) -> float:
    """Seconds from ``now`` (a Unix time) the answer asks us to wait; 0 when it does not say.

    ``Retry-After`` counts on any answer. DigitalOcean sends ``ratelimit-reset`` on every
    answer, so it counts only when the answer is throttling: the time the hourly budget comes
    back when it is spent (``ratelimit-remaining: 0``), else at most ``BURST_WAIT`` (the
    per-minute burst limit was hit, which frees up within a minute). Header names are compared
    without case; unreadable values count as not given."""
    lowered = {name.lower(): value.strip() for name, value in headers.items()}
    given = lowered.get("retry-after", "")
    if given.isdigit():
        return float(given)
    if given:
        try:
            when = parsedate_to_datetime(given)
        except (TypeError, ValueError, IndexError):
            when = None
        if when is not None:
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            return max(0.0, when.timestamp() - now)
    reset = lowered.get("ratelimit-reset", "")
    if not throttled or not reset.isdigit():
        return 0.0
    wait = max(0.0, float(reset) - now)
    remaining = lowered.get("ratelimit-remaining", "")
    return min(wait, BURST_WAIT) if remaining.isdigit() and int(remaining) > 0 else wait
