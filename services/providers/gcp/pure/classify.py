"""Compute Engine errors into the taxonomy: a pure table, tested row by row
(docs/architecture.md, The provider contract).

The inputs are what every failure carries: the HTTP status (None for an error reported inside an
operation, which has only codes) and the reasons (``errors[].reason`` of the JSON error, the
ErrorInfo reason, or an operation's ``errors[].code``). Reasons are compared without case,
``_`` or ``-``, because GCE spells one reason ``quotaExceeded`` in an HTTP error and
``QUOTA_EXCEEDED`` in an operation.

Quota and capacity come first, whatever the status (403, 429 or 503 depending on the API
surface): the reconciler must back off slowly and say why, not latch Failed or retry hot.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.providers.base import (
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)

QUOTA_REASONS = frozenset(
    {
        "quotaexceeded",
        "zoneresourcepoolexhausted",
        "zoneresourcepoolexhaustedwithdetails",
        "regionresourcepoolexhausted",
    }
)
TRANSIENT_REASONS = frozenset(
    {
        "ratelimitexceeded",
        "userratelimitexceeded",
        "resourceoperationrateexceeded",
        "backenderror",
        "internalerror",
        "resourcenotready",
    }
)
# 408 timeout, 409 conflict (an operation on the instance is in progress), 412 fingerprint
# race, 425 too early, 429 rate limited without a quota reason.
TRANSIENT_STATUSES = frozenset({408, 409, 412, 425, 429})


def normalize(reason: str) -> str:
    return reason.replace("_", "").replace("-", "").lower()


def classify(status: int | None, reasons: Iterable[str], *, op: str = "") -> type[ProviderError]:
    """The class for a failed call ``op`` (create, get, delete, list).

    A 404 on create names something the instance refers to (image, machine type, network,
    zone) that does not exist: that is a bad spec (Permanent), not an absent instance.
    """
    normalized = {normalize(reason) for reason in reasons if reason}
    if normalized & QUOTA_REASONS:
        return QuotaExceeded
    if normalized & TRANSIENT_REASONS:
        return Transient
    if status is None:
        # An operation's own error code: it failed for a reason retrying will not change.
        return Permanent
    if status == 404:
        return Permanent if op == "create" else NotFound
    if status in TRANSIENT_STATUSES or status >= 500:
        return Transient
    if 400 <= status < 500:
        return Permanent
    # 1xx-3xx reported as an error: a proxy or load balancer in between misbehaved.
    return Transient
