"""One end of a lease recorded by whichever replica gets there first.

The expiry sweep and the revocation sweep both end leases that no client asked to end, on every
replica. The msg id derives from the lease and the sequence the replica folded, and the append
expects that sequence, so replicas that saw the same state store one event between them, and one
whose view is behind gets a conflict and looks again next pass
(docs/decisions/0139-the-discovery-api-s-edges.md).
"""

from __future__ import annotations

from events import subjects
from events.errors import ConcurrencyError
from events.schemas import LeaseExpired, LeaseReleased
from events.store import EventStore, NewEvent, derive_msg_id
from projections.lease import LeaseView


async def record_end(
    store: EventStore, view: LeaseView, event: LeaseExpired | LeaseReleased, kind: str
) -> bool:
    """Whether this call stored ``event`` (False: another replica did, or the lease moved on).
    ``kind`` keeps the msg ids of different ends of one lease apart."""
    current = view.current
    assert current is not None
    msg_id = derive_msg_id(kind, current.lease_id, str(view.last_seq))
    try:
        result = await store.append(
            subjects.lease(view.proxy_uid), [NewEvent(event, msg_id)], expected_seq=view.last_seq
        )
    except ConcurrencyError:
        return False  # something happened to it meanwhile; the next pass looks again
    return not result.duplicates
