"""Hetzner's answers into the taxonomy, row by row, and the delay a throttled answer asks for."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from services.providers.base import (
    MAX_RETRY_AFTER,
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from services.providers.hetzner.pure.classify import classify, retry_after, throttled

NOW = 1_800_000_000.0
IN_90_SECONDS = format_datetime(datetime.fromtimestamp(NOW + 90, UTC), usegmt=True)


@pytest.mark.parametrize(
    ("code", "status", "op", "expected"),
    [
        # quota and capacity, whatever the status
        ("resource_limit_exceeded", 403, "create", QuotaExceeded),
        ("resource_unavailable", 412, "create", QuotaExceeded),
        ("placement_error", 412, "create", QuotaExceeded),
        ("no_space_left_in_location", 422, "create", QuotaExceeded),
        # throttling, the backend, races
        ("rate_limit_exceeded", 429, "create", Transient),
        ("limit_reached", 429, "get", Transient),
        ("server_error", 500, "list", Transient),
        ("service_error", 503, "get", Transient),
        ("unavailable", 503, "create", Transient),
        ("bad_gateway", 502, "get", Transient),
        ("timeout", 504, "delete", Transient),
        ("locked", 423, "delete", Transient),
        ("conflict", 409, "create", Transient),
        ("robot_unavailable", 503, "create", Transient),
        ("unknown_error", 500, "create", Transient),
        ("maintenance", 503, "create", Transient),
        # the request or the credentials are wrong: retrying will not help
        ("invalid_input", 400, "create", Permanent),
        ("json_error", 400, "create", Permanent),
        ("forbidden", 403, "delete", Permanent),
        ("unauthorized", 401, "get", Permanent),
        ("token_readonly", 403, "create", Permanent),
        ("protected", 403, "delete", Permanent),
        ("uniqueness_error", 409, "create", Permanent),
        ("resource_locked", 423, "create", Permanent),
        ("deprecated_api_endpoint", 410, "list", Permanent),
        ("invalid_server_type", 422, "create", Permanent),
        ("resource_in_use", 422, "delete_leftover", Permanent),
        # not found: the server on get/delete, a thing it refers to on create
        ("not_found", 404, "get", NotFound),
        ("not_found", 404, "delete", NotFound),
        ("not_found", 404, "create", Permanent),
        # no JSON error (a proxy's page): the status decides
        (502, 502, "get", Transient),
        (404, 404, "get", NotFound),
        (404, 404, "create", Permanent),
        (400, 400, "create", Permanent),
        (429, None, "list", Transient),
        (418, 418, "get", Permanent),
        (302, 302, "get", Transient),
        # a code this table does not know: the status decides
        ("brand_new_code", 400, "create", Permanent),
        ("brand_new_code", 409, "create", Transient),
        ("brand_new_code", 503, "create", Transient),
        ("brand_new_code", None, "create", Transient),
        (None, None, "get", Transient),
    ],
)
def test_classification(
    code: str | int | None, status: int | None, op: str, expected: type[ProviderError]
) -> None:
    assert classify(code, status, op=op) is expected


@pytest.mark.parametrize(
    ("headers", "code", "status", "expected"),
    [
        # a throttle waits for one request of the bucket (3600 an hour: one a second) ...
        ({"RateLimit-Reset": str(int(NOW) + 120)}, "rate_limit_exceeded", 429, 1.0),
        ({"ratelimit-reset": str(int(NOW) + 5)}, "rate_limit_exceeded", None, 1.0),
        ({"RateLimit-Limit": "360", "RateLimit-Reset": str(int(NOW) + 60)}, None, 429, 10.0),
        # ... never past the moment the bucket is full again
        ({"RateLimit-Limit": "60", "RateLimit-Reset": str(int(NOW) + 20)}, None, 429, 20.0),
        ({"RateLimit-Reset": str(int(NOW) - 60)}, "rate_limit_exceeded", 429, 1.0),
        # every answer carries the reset: only a throttle makes it a delay
        ({"RateLimit-Reset": str(int(NOW) + 60)}, "server_error", 500, 0.0),
        ({"Retry-After": "30"}, "rate_limit_exceeded", 429, 30.0),
        ({"Retry-After": "30", "RateLimit-Reset": str(int(NOW) + 99)}, None, 429, 30.0),
        ({"Retry-After": "7"}, "unavailable", 503, 7.0),
        ({"Retry-After": IN_90_SECONDS}, None, 429, 90.0),
        ({"Retry-After": "Fri, 15 Jan 2027 08:00:10"}, None, 429, 1.0),  # no zone
        ({"Retry-After": "soon"}, None, 429, 1.0),
        ({"Retry-After": "-5"}, None, 429, 1.0),
        ({"Retry-After": "nan", "RateLimit-Reset": "inf"}, None, 429, 1.0),
        ({"RateLimit-Limit": "0", "RateLimit-Reset": "tomorrow"}, None, 429, 1.0),
        ({"RateLimit-Limit": "nan"}, "rate_limit_exceeded", 429, 1.0),
        ({"RateLimit-Reset": "tomorrow"}, "rate_limit_exceeded", 429, 1.0),
        ({}, "rate_limit_exceeded", 429, 1.0),
        ({}, "server_error", 500, 0.0),
    ],
)
def test_retry_after(
    headers: dict[str, str], code: str | None, status: int | None, expected: float
) -> None:
    assert retry_after(headers, NOW, code=code, status=status) == pytest.approx(expected)


def test_a_long_retry_after_is_bounded_by_the_error() -> None:
    delay = retry_after({"Retry-After": "86400"}, NOW, code=None, status=429)
    assert delay == 86_400.0
    assert Transient("throttled", retry_after=delay).retry_after == MAX_RETRY_AFTER


def test_throttled() -> None:
    assert throttled("rate_limit_exceeded", 429)
    assert throttled(None, 429)
    assert throttled("limit_reached", None)
    assert not throttled("server_error", 503)
