"""The projections discovery answers from, kept current by two projectors.

``proxies`` folds ``proxy.*.*`` into ``ProxyView``s; ``leases`` folds ``lease.*`` into
``LeaseView``s and keeps the lease-id index. Both record the newest JetStream timestamp they
applied, which bounds this replica's idea of "now" from below (``now``).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TypeVar

from nats.js import JetStreamContext

from events import subjects
from events.store import EventStore, Recorded
from projections import lease as lease_fold
from projections import proxy as proxy_fold
from projections.lease import LeaseRecord, LeaseView
from projections.projector import Projector
from projections.proxy import ProxyView

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
V = TypeVar("V")
BURST = 32
"""Consecutive single events after which the follower switches to batches (a backlog)."""


async def follow(projector: Projector[V], batch: int) -> None:
    """Keep ``projector`` current with low latency.

    nats-py's batch fetch returns only when its batch is full or its wait is over, so a
    projector fetching 1,000 at a time shows a lone new event up to a whole wait late. Following
    asks for one event at a time instead, which returns the moment it is stored (read-your-writes
    in milliseconds, one request a second when idle), and switches to full batches while events
    keep coming (a backlog, a rebuild), where a batch fills at once.
    """
    streak = 0
    while True:
        if streak >= BURST:
            projector.batch = batch
            got = await projector.step(no_wait=True)
            streak = BURST if got >= batch else 0
        else:
            projector.batch = 1
            got = await projector.step()
            streak = streak + 1 if got else 0


class Views:
    def __init__(
        self,
        js: JetStreamContext,
        store: EventStore,
        *,
        batch: int = 1000,
    ) -> None:
        self.store = store
        self.index: dict[str, str] = {}
        """lease id -> proxy uid, for every lease a lease view holds."""
        self.newest = EPOCH
        self._apply_lease = lease_fold.indexed(self.index)
        self.proxies: Projector[ProxyView] = Projector(
            js, subjects.PROXY_STREAM, "proxy.*.*", self._on_proxy, batch=batch
        )
        self.leases: Projector[LeaseView] = Projector(
            js, subjects.LEASE_STREAM, "lease.*", self._on_lease, batch=batch
        )
        self.batch = batch
        self.caught_up = False

    def _seen(self, recorded: Recorded) -> None:
        self.newest = max(self.newest, recorded.timestamp)

    def _on_proxy(self, view: ProxyView | None, recorded: Recorded) -> ProxyView:
        self._seen(recorded)
        return proxy_fold.apply(view, recorded)

    def _on_lease(self, view: LeaseView | None, recorded: Recorded) -> LeaseView:
        self._seen(recorded)
        return self._apply_lease(view, recorded)

    # ------------------------------------------------------------------------------ running

    async def catch_up(self) -> None:
        await self.proxies.catch_up()
        await self.leases.catch_up()
        self.caught_up = True

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(follow(self.proxies, self.batch), name="discovery-proxies")
            group.create_task(follow(self.leases, self.batch), name="discovery-leases")

    async def close(self) -> None:
        await self.proxies.close()
        await self.leases.close()

    # ---------------------------------------------------------------------------- questions

    def now(self) -> datetime:
        """This replica's best idea of the server's time: the local clock, but never earlier
        than the newest JetStream timestamp seen. Only a hint for choosing candidates and for
        showing states: whether a claim holds is decided by the fold, on the claim's own
        timestamp."""
        return max(datetime.now(UTC), self.newest)

    def proxy(self, uid: str) -> ProxyView | None:
        return self.proxies.views.get(uid)

    def all_proxies(self) -> list[ProxyView]:
        return list(self.proxies.views.values())

    def lease_view(self, uid: str) -> LeaseView | None:
        return self.leases.views.get(uid)

    def find_lease(self, lease_id: str) -> tuple[LeaseView, LeaseRecord] | None:
        uid = self.index.get(lease_id)
        view = self.leases.views.get(uid) if uid else None
        record = lease_fold.find(view, lease_id)
        return None if view is None or record is None else (view, record)

    def active_leases(self) -> list[LeaseView]:
        return [v for v in self.leases.views.values() if v.current is not None]

    async def wait_for_lease_seq(self, seq: int, timeout: float) -> None:
        await self.leases.wait_for(seq, timeout)

    async def fresh_lease_view(self, uid: str) -> LeaseView | None:
        """The lease view with whatever the projector has not applied yet read from the store:
        exact after a conflict, without waiting for the projector."""
        view = self.lease_view(uid)
        after = view.last_seq if view is not None else 0
        history = await self.store.read(subjects.lease(uid), after_seq=after)
        return lease_fold.fold(history.events, view)
