"""The reconciler's two questions to a proxy's lease subject
(docs/decisions/0085-a-fresh-ip-without-downtime.md).

- Is the proxy leased? Asked only when a decision depends on it (``decide_rotate.needs_lease``): a
  leased proxy whose spec changed is replaced make-before-break, so that its lease never points
  at a deleted instance; an unleased one is replaced delete-first, as before.
- After a promotion: switch the lease to the new instance. ``LeaseSwitched`` is appended with
  the expected last sequence of ``lease.<uid>`` that was folded, and a msg id derived from the
  rotation and the lease, so two replicas (or a redelivery) store it once, and a lease that
  changed meanwhile (released, renewed, a new holder) is folded again and switched as it now
  stands. The lease fold ignores a switch of a lease that is no longer current.

The switch comes after the promotion (the proxy's status shows the new address first) and
before the old instance is deleted: the reconciler checks it again on every reconcile while the
old instance is still there, so a crash between the two appends is made good by the next one.
"""

from __future__ import annotations

from datetime import UTC, datetime

import structlog

from events import subjects
from events.errors import ConcurrencyError
from events.schemas import LeaseSwitched
from events.store import EventStore, NewEvent, derive_msg_id
from projections.lease import LeaseView, fold
from projections.lease_queries import is_free

log = structlog.get_logger("egress.reconciler")

MAX_ATTEMPTS = 20
"""Conflicts tolerated in a row: each is another writer's append (a report, a renewal); a busy
lease settles long before, and a reconcile that gives up is redelivered and tries again."""


async def _lease_view(store: EventStore, uid: str) -> tuple[LeaseView | None, int]:
    history = await store.read(subjects.lease(uid))
    return fold(list(history.events)), history.last_seq


async def is_leased(store: EventStore, uid: str) -> bool:
    """Whether a lease holds the proxy now (by this process's clock: a lease that ends in the
    next moment still counts, which errs on the side of no downtime)."""
    view, _ = await _lease_view(store, uid)
    return not is_free(view, datetime.now(UTC))


async def switch_lease(
    store: EventStore, uid: str, rotation_id: str, provider_id: str, ip: str
) -> bool:
    """Switch the proxy's current lease, if any, to the instance a rotation promoted; whether an
    event was appended (False: no lease, or it is switched already)."""
    aggregate = subjects.lease(uid)
    for _ in range(MAX_ATTEMPTS):
        view, last_seq = await _lease_view(store, uid)
        current = view.current if view is not None else None
        if current is None or is_free(view, datetime.now(UTC)):
            return False
        if current.rotation_id == rotation_id:
            return False
        event = LeaseSwitched(
            lease_id=current.lease_id,
            proxy_uid=uid,
            rotation_id=rotation_id,
            provider_id=provider_id,
            ip=ip,
        )
        msg_id = derive_msg_id("lease-switched", uid, rotation_id, current.lease_id)
        try:
            await store.append(aggregate, [NewEvent(event, msg_id)], expected_seq=last_seq)
        except ConcurrencyError:
            continue
        log.info(
            "lease switched", proxy_uid=uid, lease_id=current.lease_id, rotation_id=rotation_id
        )
        return True
    raise ConcurrencyError(str(aggregate), last_seq, "it kept changing while its lease switched")
