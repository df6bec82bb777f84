"""EC2 errors into the taxonomy: a pure table, tested row by row
(docs/architecture.md, The provider contract).

The inputs are what every EC2 error answer carries: its code (``InsufficientInstanceCapacity``,
``InvalidAMIID.NotFound``) and the HTTP status. Codes come first, whatever the status: EC2
answers throttling with 503 and some capacity refusals with 500, and the reconciler must back off
slowly for quota, retry for throttling, and latch Failed for a bad spec. A code this table does
not know falls back on the status: 5xx (and 429) Transient, other 4xx Permanent.
"""

from __future__ import annotations

import math
from datetime import datetime
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
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientFreeAddressesInSubnet",
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "AddressLimitExceeded",
        "ResourceLimitExceeded",
        "SecurityGroupLimitExceeded",
        "RulesPerSecurityGroupLimitExceeded",
        "TagLimitExceeded",
    }
)
TRANSIENT_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
        "ServiceUnavailable",
        "Unavailable",
        "InternalError",
        "InternalFailure",
        "RequestTimeout",
        "RequestExpired",
        # An instance or group between states (a terminate racing a launch), or a group still
        # used by an instance that is shutting down: the next try sees the settled state.
        "IncorrectState",
        "IncorrectInstanceState",
        "DependencyViolation",
        # A security group deleted between our lookup and the launch: the provider forgets the
        # one it had and makes it again at the next try.
        "InvalidGroup.NotFound",
        "InvalidGroup.Duplicate",
    }
)
INSTANCE_NOT_FOUND = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})
"""On get and delete: the instance does not exist (any more)."""
PERMANENT_CODES = frozenset(
    {
        "InvalidParameterValue",
        "InvalidParameterCombination",
        "InvalidParameter",
        "MissingParameter",
        "Unsupported",
        "UnsupportedOperation",
        "UnauthorizedOperation",
        "AuthFailure",
        "OptInRequired",
        "Blocked",
        "PendingVerification",
        "SignatureDoesNotMatch",
        "InvalidClientTokenId",
        "InvalidKeyPair.NotFound",
        "InvalidSubnetID.NotFound",
        "InvalidVpcID.NotFound",
        "InvalidInstanceType",
        "InvalidUserData.Malformed",
        "InvalidBlockDeviceMapping",
    }
)
PERMANENT_PREFIXES = ("InvalidAMIID.", "InvalidSubnet", "InvalidVpc", "InvalidKeyPair.")


def classify(code: str, status: int | None, *, op: str = "") -> type[ProviderError]:
    """The class for a failed call ``op`` (create, get, delete, list, firewall, leftovers).

    An ``InvalidInstanceID.*`` on create names nothing we sent (we send no instance id): it is
    read like any other code, by its status."""
    if code in QUOTA_CODES:
        return QuotaExceeded
    if code in TRANSIENT_CODES:
        return Transient
    if code in INSTANCE_NOT_FOUND and op in ("get", "delete"):
        return NotFound
    if code in PERMANENT_CODES or code.startswith(PERMANENT_PREFIXES):
        return Permanent
    if status is None:
        return Transient  # no answer at all reached us
    if status == 429 or status >= 500:
        return Transient
    if 400 <= status < 500:
        return Permanent
    # 1xx-3xx reported as an error: something in between misbehaved.
    return Transient


def retry_after(header: str, now: datetime) -> float:
    """Seconds from ``now`` that a ``Retry-After`` header asks for (delta-seconds or an HTTP
    date), 0 for a missing, malformed or past one; the base class caps it."""
    value = header.strip()
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return 0.0
        if when.tzinfo is None:
            return 0.0
        seconds = (when - now).total_seconds()
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0
