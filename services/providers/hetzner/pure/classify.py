"""Hetzner Cloud errors into the taxonomy, and the delay a throttled answer asks for: pure
tables, tested row by row (docs/architecture.md, The provider contract).

The inputs are what a failure carries: the error ``code`` of Hetzner's JSON error (or the HTTP
status when the body was no JSON error: a proxy in between, a 502 page), the HTTP status, and
the response headers. The code decides first, the status only when the code is not known:
Hetzner answers capacity with 412 and quota with 403, and neither is a bad request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

from services.providers.base import (
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)

QUOTA_CODES = frozenset(
    {
        "resource_limit_exceeded",  # 403: the project's server (or core) limit
        "resource_unavailable",  # 412: no capacity for this type in this location
        "placement_error",  # no host could take the server
        "no_space_left_in_location",
    }
)
TRANSIENT_CODES = frozenset(
    {
        "rate_limit_exceeded",
        "limit_reached",  # the old spelling of rate_limit_exceeded
        "server_error",
        "service_error",
        "unknown_error",
        "unavailable",
        "bad_gateway",
        "timeout",
        "locked",  # another action runs on the resource
        "conflict",  # the resource changed during the request
        "robot_unavailable",
        # Hetzner's maintenance ends by itself: retrying with backoff is right, latching the
        # Proxy Failed (until someone edits its spec) is not.
        "maintenance",
    }
)
PERMANENT_CODES = frozenset(
    {
        "invalid_input",
        "json_error",
        "forbidden",
        "unauthorized",
        "token_readonly",
        "protected",
        "uniqueness_error",
        "resource_locked",  # "contact support": no retry will help
        "deprecated_api_endpoint",
        "unsupported_error",
        "invalid_server_type",
        "resource_in_use",
        "server_not_stopped",
        "primary_ip_assigned",
        "private_net_only_server",
    }
)
# 408 timeout, 409 conflict, 423 locked, 425 too early, 429 throttled.
TRANSIENT_STATUSES = frozenset({408, 409, 423, 425, 429})


def classify(code: str | int | None, status: int | None, *, op: str = "") -> type[ProviderError]:
    """The class for a failed call ``op`` (create, get, delete, list, ...).

    ``not_found`` on create names something the server refers to (an image, a network, an SSH
    key, the firewall) that does not exist: a bad spec (Permanent), not an absent server.
    """
    name = code if isinstance(code, str) else ""
    http = status if status is not None else code if isinstance(code, int) else None
    if name in QUOTA_CODES:
        return QuotaExceeded
    if name in TRANSIENT_CODES:
        return Transient
    if name == "not_found" or (not name and http == 404):
        return Permanent if op == "create" else NotFound
    if name in PERMANENT_CODES:
        return Permanent
    if http is None:
        return Transient
    if http in TRANSIENT_STATUSES or http >= 500:
        return Transient
    if 400 <= http < 500:
        return Permanent
    # 1xx-3xx reported as an error: something in between misbehaved.
    return Transient


HOUR = 3600.0
DEFAULT_LIMIT = 3600.0
"""Requests an hour a Hetzner Cloud project may make unless its answers say otherwise."""


def throttled(code: str | int | None, status: int | None) -> bool:
    return code in ("rate_limit_exceeded", "limit_reached") or status == 429


def retry_after(
    headers: Mapping[str, str], now: float, *, code: str | int | None, status: int | None
) -> float:
    """Seconds the answer asks us to wait, 0 when it does not say.

    ``Retry-After`` (seconds or an HTTP date) counts on any error. A throttle (429 /
    ``rate_limit_exceeded``) without it waits for one request's worth of Hetzner's bucket: it
    holds ``RateLimit-Limit`` requests an hour and refills one at a time (one a second at the
    default 3,600), so the next request is allowed after ``3600 / limit`` seconds.
    ``RateLimit-Reset``, sent on every answer, is when the bucket is *full* again (up to an
    hour away): it bounds the wait, it is not the wait. A broken header reads as 0, or as the
    default limit.
    """
    lowered = {key.lower(): value for key, value in headers.items()}
    after = _retry_after_header(lowered.get("retry-after", ""), now)
    if after > 0:
        return after
    if not throttled(code, status):
        return 0.0
    limit = _number(lowered.get("ratelimit-limit", ""))
    one_request = HOUR / limit if limit is not None and limit >= 1 else HOUR / DEFAULT_LIMIT
    reset = _number(lowered.get("ratelimit-reset", ""))
    if reset is not None and now < reset:
        return min(reset - now, one_request)
    return one_request


def _retry_after_header(value: str, now: float) -> float:
    value = value.strip()
    if not value:
        return 0.0
    seconds = _number(value)
    if seconds is not None:
        return max(seconds, 0.0)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return 0.0
    if moment.tzinfo is None:
        return 0.0
    return max(moment.timestamp() - now, 0.0)


def _number(value: str) -> float | None:
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None
