"""The expiry sweep: records ``LeaseExpired`` for leases past their end.

A lease is over at ``expires_at`` whether or not this event exists (the fold and the API say so
on their own); the sweep makes the log tell the story too, so ``egress-proxies events`` shows
when a holder let its lease run out. Every replica sweeps: the msg id derives from the lease
and the folded sequence, and the append expects that sequence, so replicas that saw the same
state store one event between them, and a replica whose view is behind gets a conflict and
simply looks again next time. An event appended too early (a clock running ahead) is ignored by
the fold. Each pass then ends the leases whose proxy is going away (``revocation.py``, D139).
"""

from __future__ import annotations

import asyncio

import structlog

from events.errors import EventStoreError
from events.schemas import LeaseExpired
from events.store import EventStore
from projections.lease import LeaseView
from services.discovery.leasing.ending import record_end
from services.discovery.leasing.revocation import revoke
from services.discovery.leasing.withdraw import Withdrawals
from services.discovery.observability.metrics import DiscoveryMetrics
from services.discovery.views import Views
from services.runtime.aio import raise_if_cancelled

log = structlog.get_logger("egress.discovery")


class ExpirySweep:
    def __init__(
        self,
        store: EventStore,
        views: Views,
        metrics: DiscoveryMetrics,
        withdrawals: Withdrawals | None = None,
    ) -> None:
        self.store = store
        self.views = views
        self.metrics = metrics
        self.withdrawals = withdrawals

    async def sweep(self) -> int:
        """One pass; returns how many ``LeaseExpired`` events it stored."""
        now = self.views.now()
        active = self.views.active_leases()
        due: list[LeaseView] = [
            v for v in active if v.current is not None and now >= v.current.expires_at
        ]
        self.metrics.active.set(len(active) - len(due))
        recorded = 0
        for view in due:
            current = view.current
            assert current is not None
            event = LeaseExpired(lease_id=current.lease_id, proxy_uid=view.proxy_uid)
            if await record_end(self.store, view, event, "lease-expired"):
                recorded += 1
                self.metrics.expirations.inc()
        return recorded

    async def run(self, interval: float) -> None:
        while True:
            raise_if_cancelled()  # nats-py can swallow a cancellation inside an append
            try:
                if self.withdrawals is not None and self.withdrawals.doubts:
                    await self.withdrawals.settle()
                await self.sweep()
                await revoke(self.store, self.views)  # a lease whose proxy is going (D139)
            except EventStoreError as exc:
                log.warning("lease expiry sweep failed, trying again", error=str(exc))
            await asyncio.sleep(interval)
