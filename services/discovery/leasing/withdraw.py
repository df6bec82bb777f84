"""Withdrawing claims whose requester was told they failed.

An append that times out because nats-server went away has an unknown outcome: the server may
have stored the claim just before it died. The client was answered `503 unavailable`, so a claim
that the fold granted anyway would hold a proxy for nobody until its TTL ran out (a "ghost
lease"). The lease's deadline does not help here: the claim was stored in time; only its
acknowledgement was lost.

So the replica remembers each such claim, and once it can read the log again it looks: a claim
that is not there was never stored (nats-py sends what it buffered before anything newer, so a
read answered after the reconnection sees it if it was sent at all); a claim the fold granted is
withdrawn at once with a `LeaseReleased` marked `withdrawn` and no cooldown. While NATS is down no
proxy can be leased anyway, so a withdrawn claim held its proxy only for the outage.

A claim sent with an `Idempotency-Key` is not withdrawn: its requester was told to retry with the
key to learn the outcome (docs/api.md), and a retry may already have been answered with this very
lease by another replica. The doubts live in memory: a replica killed before it settles them
leaves those leases to expire on their own (docs/decisions/).
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from events import subjects
from events.errors import EventStoreError
from events.schemas import LeaseAcquired, LeaseReleased
from events.store import EventStore, NewEvent, derive_msg_id
from projections.lease_queries import active
from services.discovery.views import Views

log = structlog.get_logger("egress.discovery")

MAX_DOUBTS = 10_000
"""Bounds the memory an outage under heavy load can take; beyond it the oldest doubt is dropped
(its lease, if granted, expires on its own)."""


@dataclass(frozen=True, slots=True)
class Doubt:
    proxy_uid: str
    lease_id: str
    after_seq: int
    """The lease subject's sequence the claim expected: it can only have been stored after it."""


class Withdrawals:
    def __init__(self, store: EventStore, views: Views) -> None:
        self.store = store
        self.views = views
        self.doubts: dict[str, Doubt] = {}
        self.withdrawn = 0

    def doubt(self, proxy_uid: str, lease_id: str, after_seq: int) -> None:
        if len(self.doubts) >= MAX_DOUBTS:
            self.doubts.pop(next(iter(self.doubts)))
        self.doubts[lease_id] = Doubt(proxy_uid, lease_id, after_seq)

    async def settle(self) -> int:
        """One pass over the doubts; returns how many claims it withdrew. A doubt stays while
        the log cannot be read."""
        withdrawn = 0
        for doubt in list(self.doubts.values()):
            try:
                if await self._settle(doubt):
                    withdrawn += 1
            except EventStoreError as exc:
                log.info("lease claim still in doubt", lease_id=doubt.lease_id, error=str(exc))
                break  # the log is still out of reach: the next pass tries again
            self.doubts.pop(doubt.lease_id, None)
        self.withdrawn += withdrawn
        return withdrawn

    async def _settle(self, doubt: Doubt) -> bool:
        history = await self.store.read(subjects.lease(doubt.proxy_uid), after_seq=doubt.after_seq)
        stored = any(
            isinstance(r.event, LeaseAcquired) and r.event.lease_id == doubt.lease_id
            for r in history.events
        )
        if not stored:
            return False
        view = await self.views.fresh_lease_view(doubt.proxy_uid)
        if active(view, doubt.lease_id, self.views.now()) is None:
            return False  # refused by the fold (late, or the proxy was taken), or over already
        event = LeaseReleased(
            lease_id=doubt.lease_id,
            proxy_uid=doubt.proxy_uid,
            cooldown_seconds=0.0,
            withdrawn=True,
        )
        msg_id = derive_msg_id("lease-withdrawn", doubt.lease_id)
        await self.store.append(subjects.lease(doubt.proxy_uid), [NewEvent(event, msg_id)])
        log.warning(
            "withdrew a lease claim its requester was told had failed",
            proxy_uid=doubt.proxy_uid,
            lease_id=doubt.lease_id,
        )
        return True
