"""The API's error answers as exceptions a crawler can catch by what they mean.

Every error answer of the discovery API has the shape ``{"error": code, "message": text}``
(docs/api.md, "Errors"); the code, not the status, says which exception it is, so a new code the
client does not know still arrives as an ``EgressError`` carrying it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from egress_proxies_client.models import Rotation


class EgressError(Exception):
    """Any refusal or failure of the discovery API. ``code`` is the answer's ``error`` field
    ("" when there was no answer at all), ``status`` its HTTP status (0 without one)."""

    def __init__(self, message: str, *, code: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status


class NoMatchingProxy(EgressError):
    """422 ``no_matching_proxy``: no proxy has the selector's attributes, or every one that has
    them was excluded. Waiting will not help; the message names the attributes that exist."""


class NoProxyAvailable(EgressError):
    """503 ``no_proxy_available``: proxies match, but none can be leased now. ``retry_after`` is
    the server's estimate, in seconds, of when one can."""

    def __init__(
        self, message: str, *, retry_after: float, code: str = "", status: int = 0
    ) -> None:
        super().__init__(message, code=code, status=status)
        self.retry_after = retry_after


class LeaseLimit(NoProxyAvailable):
    """429 ``lease_limit``: this client holds as many leases as its ``maxLeases`` allows. A kind
    of ``NoProxyAvailable``: a pool waits for one of its own leases to end, as it does for a
    busy fleet, instead of failing the request."""


class UnknownLease(EgressError):
    """404 ``unknown_lease``: the lease was never issued, or is over (released or expired)."""


class LeaseEnded(UnknownLease):
    """409 ``lease_ended``: an ``Idempotency-Key`` whose lease is over; a new lease needs a new
    key. A kind of ``UnknownLease``, since for the caller the lease is gone either way."""


class LeaseRevoked(UnknownLease):
    """410 ``lease_revoked``: the service ended the lease under its holder, because its proxy is
    being deleted or left the pool it was leased from (the message says which). A kind of
    ``UnknownLease``: the lease is gone, and a new one is on another proxy."""


class UnknownProxy(EgressError):
    """404 ``unknown_proxy``: the ``proxy_uid`` asked for does not exist (any more)."""


class UnknownPool(EgressError):
    """404 ``unknown_pool``: the ``pool`` asked for does not exist (the message names the pools
    of that name in other namespaces)."""


class AuthError(EgressError):
    """401 ``unauthorized``: the token is missing or wrong."""


class Forbidden(AuthError):
    """403 ``forbidden`` (the client lacks the scope, or may not lease with that selector) or
    ``not_your_lease`` (another client acquired the lease): asking again will not help."""


class Unavailable(EgressError):
    """The API could not be reached, or answered 503 ``unavailable`` (it cannot reach its event
    log), after the client's retries. ``retry_after`` is when to try again, in seconds."""

    def __init__(
        self, message: str, *, retry_after: float, code: str = "", status: int = 0
    ) -> None:
        super().__init__(message, code=code, status=status)
        self.retry_after = retry_after


class RotationFailed(EgressError):
    """A rotation waited for ended ``failed`` (its replacement could not be created or failed
    its probes) or ``cancelled`` (the proxy's spec changed or it is being deleted). The lease
    stays on its instance and is still held; ``rotation`` is the server's last word on it."""

    def __init__(self, message: str, *, rotation: Rotation) -> None:
        super().__init__(message, code=rotation.state)
        self.rotation = rotation
