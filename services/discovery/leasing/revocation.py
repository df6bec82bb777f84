"""Ending leases whose proxy is going away, and answering their holders
(docs/decisions/0139-the-discovery-api-s-edges.md; the rule is ``pure.revocation``).

Every replica sweeps, beside the expiry sweep and as it does (``ending.py``): replicas that saw
the same state store one event between them. The release is the system's own (no client, no
cooldown: the proxy is leaving the fleet or the pool) and carries the reason, so
``egress-proxies events`` says why.
The fold ends the lease only if it is still the current one, so a holder's release racing this
one leaves one of them without effect, never two ends.
"""

from __future__ import annotations

import structlog

from events.schemas import LeaseReleased
from events.store import EventStore
from projections.lease import LeaseView
from projections.lease_queries import find
from services.discovery.http.errors import ApiError, LeaseRevoked, UnknownLease
from services.discovery.leasing.ending import record_end
from services.discovery.pure.revocation import REASONS, revoked_message, why_revoked
from services.discovery.views import Views

log = structlog.get_logger("egress.discovery")


def due(views: Views) -> list[tuple[LeaseView, str]]:
    """The active leases to end now, each with its reason."""
    now = views.now()
    found = []
    for view in views.active_leases():
        current = view.current
        if current is None or now >= current.expires_at:
            continue  # over already: the expiry sweep records it
        reason = why_revoked(views.proxy(view.proxy_uid), current)
        if reason:
            found.append((view, reason))
    return found


async def revoke(store: EventStore, views: Views) -> int:
    """One pass; how many leases it ended (``LeaseReleased`` with a ``reason``)."""
    ended = 0
    for view, reason in due(views):
        current = view.current
        assert current is not None
        event = LeaseReleased(
            lease_id=current.lease_id, proxy_uid=view.proxy_uid, cooldown_seconds=0.0, reason=reason
        )
        if await record_end(store, view, event, "lease-revoked"):
            ended += 1
            log.warning(
                "ended a lease under its holder",
                lease_id=current.lease_id,
                proxy_uid=view.proxy_uid,
                client=current.client,
                holder=current.holder,
                reason=reason,
            )
    return ended


def gone(views: Views, lease_id: str, view: LeaseView | None = None) -> ApiError:
    """The answer for a lease that is not active: 410 ``lease_revoked`` with the reason when
    the system ended it, else 404 ``unknown_lease`` as for any lease released or expired.
    ``view``: the lease's proxy's view read from the log, newer than this replica's."""
    record = find(view, lease_id)
    if record is None:
        found = views.find_lease(lease_id)
        record = found[1] if found else None
    if record is not None and record.reason in REASONS:
        return LeaseRevoked(revoked_message(record))
    return UnknownLease(f"no active lease {lease_id!r} (unknown, released or expired)")
