"""Renewing a lease: a ``LeaseRenewed`` on ``lease.<uid>``, appended with optimistic concurrency.

The append expects the sequence this replica's view of the proxy's lease subject holds, as a
claim does. A release or an expiry recorded meanwhile (on any replica) makes it a conflict; the
renewal then re-reads the subject and either tries again on the lease as it now stands or
answers ``unknown_lease``. Whatever gets through, the fold has the last word: a renewal stamped
at or after the lease's end, or after its own deadline, changes nothing. The answer is given
from the view that includes the append, so it says what the log made of it, on every replica
(docs/api.md, "PATCH /v1/leases/{id}"; docs/decisions/0078-renewal-is-an-event-holder.md).
"""

from __future__ import annotations

import uuid

from events import subjects
from events.errors import ConcurrencyError
from events.schemas import LeaseRenewed
from events.store import NewEvent, derive_msg_id
from projections.lease import LeaseView
from projections.lease_queries import active, find
from services.discovery.http.errors import ApiError, Unavailable
from services.discovery.leasing.leases import Leases
from services.discovery.leasing.revocation import gone
from services.discovery.pure.policy import Granted


def _unknown(leases: Leases, lease_id: str, view: LeaseView | None) -> ApiError:
    """404 ``unknown_lease``, or 410 ``lease_revoked`` with the reason when the system ended
    the lease (``revocation.gone``): a holder that renews learns why it lost the proxy."""
    return gone(leases.views, lease_id, view)


async def renew(
    leases: Leases, lease_id: str, requested_ttl: float | None, *, client: str = ""
) -> Granted:
    """Make the active lease end ``ttl`` after the renewal's timestamp (the granted TTL: the
    default without one, never above the server's maximum). The fencing token stays."""
    ttl = leases.policy.grant_ttl(requested_ttl)
    views, policy = leases.views, leases.policy
    granted = await leases.current(lease_id)
    uid = granted.view.proxy_uid
    view: LeaseView | None = granted.view
    for _ in range(policy.max_attempts):
        if view is None or active(view, lease_id, views.now()) is None:
            raise _unknown(leases, lease_id, view)
        event = LeaseRenewed(
            lease_id=lease_id,
            proxy_uid=uid,
            ttl_seconds=ttl,
            requested_ttl_seconds=requested_ttl or 0.0,
            client=client,
            deadline=policy.deadline(views.server_now()),
        )
        msg_id = derive_msg_id("lease-renewed", lease_id, str(uuid.uuid4()))
        try:
            result = await leases.store.append(
                subjects.lease(uid), [NewEvent(event, msg_id)], expected_seq=view.last_seq
            )
        except ConcurrencyError:
            # Something was appended meanwhile (a report, a release, an expiry): look again.
            leases.metrics.conflicts.labels("renewal").inc()
            view = await views.fresh_lease_view(uid)
            continue
        after = await leases.view_at(uid, result.last_seq)
        record = find(after, lease_id)
        if after is not None and record is not None and record.renewed_seq >= result.last_seq:
            # Counted. The view may already hold what came next (a release on another
            # replica): the answer is what the log made of this renewal, not of what followed.
            return Granted(after, record)
        if after is None or record is None or active(after, lease_id, views.now()) is None:
            raise _unknown(leases, lease_id, after)  # the fold found it over at its timestamp
        # Stored, yet not counted: stamped after its deadline (this replica's clock runs well
        # behind the server's; it learns the difference from that very event).
        raise Unavailable(
            "the renewal reached the event log after its deadline and was not counted; try again",
            headers={"Retry-After": "1"},
        )
    raise Unavailable(
        f"the lease {lease_id!r} kept changing while it was renewed; try again",
        headers={"Retry-After": "1"},
    )
