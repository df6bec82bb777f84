"""EC2's error codes into the taxonomy, row by row, and the server's delay read from
``Retry-After``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.providers.aws.pure.classify import (
    PERMANENT_CODES,
    QUOTA_CODES,
    TRANSIENT_CODES,
    classify,
    retry_after,
)
from services.providers.base import (
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)

NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("code", "status", "op", "expected"),
    [
        # quota and capacity, whatever the status
        ("InsufficientInstanceCapacity", 500, "create", QuotaExceeded),
        ("InsufficientInstanceCapacity", 503, "create", QuotaExceeded),
        ("VcpuLimitExceeded", 400, "create", QuotaExceeded),
        ("InstanceLimitExceeded", 400, "create", QuotaExceeded),
        ("MaxSpotInstanceCountExceeded", 400, "create", QuotaExceeded),
        ("SpotMaxPriceTooLow", 400, "create", QuotaExceeded),
        ("InsufficientFreeAddressesInSubnet", 400, "create", QuotaExceeded),
        ("SecurityGroupLimitExceeded", 400, "firewall", QuotaExceeded),
        ("RulesPerSecurityGroupLimitExceeded", 400, "firewall", QuotaExceeded),
        # throttling and the service's own trouble
        ("RequestLimitExceeded", 503, "create", Transient),
        ("RequestLimitExceeded", 400, "list", Transient),
        ("Throttling", 429, "get", Transient),
        ("ThrottlingException", 400, "get", Transient),
        ("ServiceUnavailable", 503, "delete", Transient),
        ("Unavailable", 503, "list", Transient),
        ("InternalError", 500, "create", Transient),
        ("InternalFailure", 500, "create", Transient),
        ("IncorrectInstanceState", 400, "delete", Transient),
        ("DependencyViolation", 400, "leftovers", Transient),
        ("InvalidGroup.NotFound", 400, "create", Transient),
        # a bad spec, a bad account, a bad credential
        ("InvalidAMIID.NotFound", 400, "create", Permanent),
        ("InvalidAMIID.Malformed", 400, "create", Permanent),
        ("InvalidAMIID.Unavailable", 400, "create", Permanent),
        ("InvalidParameterValue", 400, "create", Permanent),
        ("InvalidParameterCombination", 400, "create", Permanent),
        ("Unsupported", 400, "create", Permanent),
        ("UnauthorizedOperation", 403, "create", Permanent),
        ("AuthFailure", 401, "list", Permanent),
        ("OptInRequired", 401, "create", Permanent),
        ("InvalidKeyPair.NotFound", 400, "create", Permanent),
        ("InvalidSubnetID.NotFound", 400, "create", Permanent),
        ("InvalidVpcID.NotFound", 400, "create", Permanent),
        ("SignatureDoesNotMatch", 403, "get", Permanent),
        # the instance is gone, on get and delete only
        ("InvalidInstanceID.NotFound", 400, "get", NotFound),
        ("InvalidInstanceID.Malformed", 400, "get", NotFound),
        ("InvalidInstanceID.NotFound", 400, "delete", NotFound),
        ("InvalidInstanceID.NotFound", 400, "create", Permanent),
        ("InvalidInstanceID.NotFound", 400, "list", Permanent),
        # unknown codes fall back on the status
        ("SomethingNew", 500, "create", Transient),
        ("SomethingNew", 502, "get", Transient),
        ("SomethingNew", 429, "get", Transient),
        ("SomethingNew", 400, "get", Permanent),
        ("SomethingNew", 404, "get", Permanent),
        ("", 503, "get", Transient),
        ("503", 503, "get", Transient),  # a 5xx with no EC2 body: botocore names the status
        ("", None, "get", Transient),
        ("", 302, "get", Transient),
    ],
)
def test_classify(code: str, status: int | None, op: str, expected: type[ProviderError]) -> None:
    assert classify(code, status, op=op) is expected


def test_no_code_is_in_two_tables() -> None:
    assert not QUOTA_CODES & TRANSIENT_CODES
    assert not QUOTA_CODES & PERMANENT_CODES
    assert not TRANSIENT_CODES & PERMANENT_CODES


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("7", 7.0),
        (" 12 ", 12.0),
        ("0.25", 0.25),
        ("0", 0.0),
        ("-5", 0.0),
        ("", 0.0),
        ("soon", 0.0),
        ("nan", 0.0),
        ("inf", 0.0),
        ("1e400", 0.0),
        ("Thu, 03 Dec 2026 12:01:30 GMT", 90.0),
        ("Thu, 03 Dec 2026 11:59:00 GMT", 0.0),  # already past
        ("Thu, 03 Dec 2026 12:01:30 -0000", 0.0),  # no zone: cannot be placed
        ("Thu, 99 Foo 2026", 0.0),
    ],
)
def test_retry_after(header: str, expected: float) -> None:
    assert retry_after(header, NOW) == expected


def test_a_huge_delay_is_capped_by_the_error_itself() -> None:
    assert Transient("x", retry_after=retry_after("999999", NOW)).retry_after == 3600.0
