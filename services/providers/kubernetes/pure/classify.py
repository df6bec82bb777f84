"""Kubernetes API errors into the taxonomy: a pure table, tested row by row
(docs/architecture.md, The provider contract).

The inputs are what every failed call carries: the HTTP status (0 when no answer came: refused,
reset, timed out) and the Status object's reason and message. A ResourceQuota refusal is a 403
(or, from some admission webhooks, a 429) whose message says ``exceeded quota``: the reconciler
must back off slowly and say why, not latch Failed. Other 403s are RBAC: Permanent until someone
fixes the Role, as is a 422 (the pod was rejected as invalid).
"""

from __future__ import annotations

from services.providers.base import (
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)

_QUOTA_WORDS = ("exceeded quota", "exceeds quota", "insufficient quota")
# 408 timeout, 409 conflict (outside create, where it means "exists"), 410 too old,
# 425 too early, 429 throttled.
TRANSIENT_STATUSES = frozenset({0, 408, 409, 410, 425, 429})


def classify(status: int, reason: str, message: str, *, op: str = "") -> type[ProviderError]:
    """The class for a failed call ``op`` (create, get, delete, list).

    A 404 on create means the namespace does not exist: the Proxy's placement is wrong
    (Permanent), not an absent instance.
    """
    text = f"{reason} {message}".lower()
    if status in (403, 429) and any(word in text for word in _QUOTA_WORDS):
        return QuotaExceeded
    if status == 404:
        return Permanent if op == "create" else NotFound
    if status in TRANSIENT_STATUSES or status >= 500:
        return Transient
    # 400, 401, 403, 405, 413, 415, 422 and anything else we did not foresee: asking again
    # will not help; latch with the apiserver's message.
    return Permanent


def error_for(status: int, reason: str, message: str, *, op: str, what: str) -> ProviderError:
    cls = classify(status, reason, message, op=op)
    answer = f"HTTP {status} {reason}".strip() if status else "no answer"
    return cls(f"{what}: {answer}: {message}" if message else f"{what}: {answer}")
