"""DigitalOcean's answers into the taxonomy, row by row, and how long a throttled call waits."""

from __future__ import annotations

import pytest

from services.providers.base import (
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from services.providers.digitalocean.pure.classify import (
    BURST_WAIT,
    classify,
    field_of,
    retry_after,
)

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("status", "error_id", "message", "op", "expected"),
    [
        # The account's limits, and a region out of stock: slow retries.
        (
            422,
            "unprocessable_entity",
            "creating this/these droplet(s) will exceed your droplet limit",
            "create",
            QuotaExceeded,
        ),
        (
            422,
            "unprocessable_entity",
            "You have reached the Droplet limit",
            "create",
            QuotaExceeded,
        ),
        (
            422,
            "unprocessable_entity",
            "Droplet limit reached for your team",
            "create",
            QuotaExceeded,
        ),
        (
            422,
            "unprocessable_entity",
            "This size is currently unavailable; capacity is limited",
            "create",
            QuotaExceeded,
        ),
        (422, "unprocessable_entity", "Firewall limit reached", "firewall", QuotaExceeded),
        # Throttling, whatever the status says.
        (429, "too_many_requests", "API Rate limit exceeded.", "create", Transient),
        (429, "", "", "list", Transient),
        (503, "too_many_requests", "slow down", "get", Transient),
        # Bad input: Permanent with DigitalOcean's words.
        (
            422,
            "unprocessable_entity",
            "You specified an invalid size for Droplet creation.",
            "create",
            Permanent,
        ),
        (422, "unprocessable_entity", "Region is not available", "create", Permanent),
        (
            422,
            "unprocessable_entity",
            "You specified an invalid image for Droplet creation.",
            "create",
            Permanent,
        ),
        (422, "unprocessable_entity", "Size is not available in this region.", "create", Permanent),
        (400, "bad_request", "unparseable JSON", "create", Permanent),
        (401, "Unauthorized", "Unable to authenticate you", "get", Permanent),
        (403, "forbidden", "You do not have access for the attempted action.", "delete", Permanent),
        # A droplet busy with another action, conflicts, and the server's own trouble.
        (422, "unprocessable_entity", "Droplet already has a pending event.", "delete", Transient),
        (409, "conflict", "", "create", Transient),
        (408, "", "", "get", Transient),
        (500, "server_error", "Unexpected server-side error", "create", Transient),
        (502, "", "Bad Gateway", "list", Transient),
        (503, "service_unavailable", "", "delete", Transient),
        (302, "", "", "get", Transient),
        # Absence: a normal answer for get and delete, a bad reference for anything else.
        (404, "not_found", "The resource you were accessing could not be found.", "get", NotFound),
        (
            404,
            "not_found",
            "The resource you were accessing could not be found.",
            "delete",
            NotFound,
        ),
        (404, "not_found", "vpc not found", "create", Permanent),
        (404, "not_found", "", "list", Permanent),
    ],
)
def test_classification(
    status: int, error_id: str, message: str, op: str, expected: type[ProviderError]
) -> None:
    assert classify(status, error_id, message, op=op) is expected


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ("You specified an invalid size for Droplet creation.", "size"),
        ("Size is not available in this region.", "size"),
        ("Region is not available", "region"),
        ("Image 'x' not found: you specified an invalid image", "image"),
        ("vpc_uuid is invalid", "vpcUuid"),
        ("ssh_keys: key not found", "sshKeys"),
        ("user_data is too large", "user data"),
        ("Something else entirely", ""),
    ],
)
def test_which_field_a_refusal_is_about(message: str, field: str) -> None:
    assert field_of(message) == field


@pytest.mark.parametrize(
    ("headers", "throttled", "wait"),
    [
        ({"Retry-After": "7"}, True, 7.0),
        ({"retry-after": "7", "ratelimit-reset": str(int(NOW) + 900)}, True, 7.0),
        ({"Retry-After": "Wed, 15 Jan 2027 08:00:10 GMT"}, True, 1800000010.0 - NOW),
        ({"Retry-After": "Wed, 15 Jan 2027 07:00:00 GMT"}, True, 0.0),  # in the past
        ({"ratelimit-reset": str(int(NOW) + 900), "ratelimit-remaining": "0"}, True, 900.0),
        ({"ratelimit-reset": str(int(NOW) + 900)}, True, 900.0),
        # Budget left: the per-minute burst limit was hit, which frees up within a minute.
        ({"ratelimit-reset": str(int(NOW) + 900), "ratelimit-remaining": "4000"}, True, BURST_WAIT),
        ({"ratelimit-reset": str(int(NOW) + 20), "ratelimit-remaining": "4000"}, True, 20.0),
        ({"ratelimit-reset": str(int(NOW) - 5)}, True, 0.0),
        # Every answer carries the reset header: it means nothing when not throttled.
        ({"ratelimit-reset": str(int(NOW) + 900)}, False, 0.0),
        ({"Retry-After": "30"}, False, 30.0),
        ({"Retry-After": "soon", "ratelimit-reset": "later"}, True, 0.0),
        ({"Retry-After": "-3"}, True, 0.0),
        ({}, True, 0.0),
    ],
)
def test_how_long_to_wait(headers: dict[str, str], throttled: bool, wait: float) -> None:
    assert retry_after(headers, NOW, throttled=throttled) == pytest.approx(wait)


def test_a_huge_wait_is_capped_by_the_error() -> None:
    error = Transient(
        "throttled", retry_after=retry_after({"Retry-After": "99999999"}, NOW, throttled=True)
    )
    assert error.retry_after == 3600.0
