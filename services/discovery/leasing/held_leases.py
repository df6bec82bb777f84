"""A lease once granted: reading it, releasing it and reporting on it (``GET``, ``DELETE`` and
``POST .../report`` of ``/v1/leases/{id}``); acquiring one is ``leases.py``, renewing and
rotating ``renewal.py`` and ``rotation.py``.

Only active leases are served: a released or expired lease answers like an unknown one.

Every write carries a ``deadline``: the server's time, as this replica knows it, plus the store's
append timeout and a margin. A write the log did not confirm in time is answered 503, and if it
reaches the log after all (nats-py sends what it buffered once it reconnects), the fold ignores
it as late: a caller told that a write failed never finds it applied later. Every answer is given
only once this replica's view shows the append (read-your-writes), so a ``GET`` of the lease right
after works here.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import structlog

from events import subjects
from events.errors import NotSent, StoreUnavailable
from events.schemas import LeaseReleased, LeaseReported
from events.store import EventStore, NewEvent, derive_msg_id
from events.subjects import Aggregate
from projections.lease import RELEASED, LeaseView, on_time
from projections.lease_queries import active, find
from projections.outcomes import BLOCKED
from services.discovery.http.errors import Unavailable, UnknownLease
from services.discovery.leasing.revocation import gone
from services.discovery.leasing.withdraw import Withdrawals
from services.discovery.observability.metrics import DiscoveryMetrics
from services.discovery.pure.policy import Granted, LeasePolicy
from services.discovery.views import Views

log = structlog.get_logger("egress.discovery")

DOUBT_RETRY = 0.2
"""Seconds between attempts to append a report whose first attempt is in doubt."""


class HeldLeases:
    def __init__(
        self, store: EventStore, views: Views, policy: LeasePolicy, metrics: DiscoveryMetrics
    ) -> None:
        self.store = store
        self.views = views
        self.policy = policy
        self.metrics = metrics
        self.withdrawals = Withdrawals(store, views)

    async def view_at(self, uid: str, seq: int) -> LeaseView | None:
        try:
            await self.views.wait_for_lease_seq(seq, self.policy.view_timeout)
        except TimeoutError:
            # The projector lags: answer from the log itself rather than not at all.
            log.warning("lease view lags, reading the log", proxy_uid=uid, seq=seq)
            return await self.views.fresh_lease_view(uid)
        return self.views.lease_view(uid)

    def get(self, lease_id: str) -> Granted:
        """The lease while it holds its proxy. Released and expired leases are answered like
        unknown ones: the API deals in leases a client can still use, and the log keeps the
        rest (``egress-proxies events --stream LEASE``)."""
        found = self.views.find_lease(lease_id)
        record = active(found[0], lease_id, self.views.now()) if found else None
        if found is None or record is None:
            raise gone(self.views, lease_id)  # 410 when the system ended it (D139)
        return Granted(found[0], record)

    async def current(self, lease_id: str) -> Granted:
        """``get``, after making sure this replica is not merely behind: a lease granted on
        another replica a moment ago may not be in this view yet, so before answering that a
        lease it has never seen is unknown, the view waits (bounded) for the log's end."""
        if self.views.find_lease(lease_id) is None:
            with contextlib.suppress(TimeoutError):
                await self.views.wait_for_lease_seq(
                    await self.views.lease_log_seq(), self.policy.view_timeout
                )
        return self.get(lease_id)

    async def release(self, lease_id: str, *, client: str = "") -> None:
        """End the lease now; the proxy cools down before its next lease.

        No sequence check: the fold ends the lease only if it is still the current one and not
        past its end, so a release can never end anything but its own lease, and a second one
        changes nothing. Each request has its own msg id: one derived from the lease alone
        would make every retry a duplicate of a first attempt that reached the log too late
        to count, and the lease could then never be released. The answer says what the fold
        made of it.
        """
        found = self.views.find_lease(lease_id)
        if found is not None:
            earlier = find(found[0], lease_id)
            if earlier is not None and earlier.end == RELEASED:
                # Released already (an earlier attempt of this DELETE, maybe answered 503 while
                # it reached the log): the lease is over, as asked.
                self.metrics.releases.labels("released").inc()
                return
        uid = (await self.current(lease_id)).view.proxy_uid
        event = LeaseReleased(
            lease_id=lease_id,
            proxy_uid=uid,
            cooldown_seconds=self.policy.cooldown,
            deadline=self.policy.deadline(self.views.server_now()),
            client=client,
        )
        msg_id = derive_msg_id("lease-released", lease_id, str(uuid.uuid4()))
        result = await self.store.append(subjects.lease(uid), [NewEvent(event, msg_id)])
        view = await self.view_at(uid, result.last_seq)
        record = find(view, lease_id)
        if record is not None and active(view, lease_id, self.views.now()) is record:
            # Stored, yet the fold let it pass as late: this replica's clock runs well behind
            # the server's (it learns the difference from every event it reads).
            raise Unavailable(
                "the release reached the event log after its deadline and was not counted; "
                "try again",
                headers={"Retry-After": "1"},
            )
        if record is None or record.end != RELEASED:
            self.metrics.releases.labels("unknown").inc()
            raise UnknownLease(f"no active lease {lease_id!r} (it expired before the release)")
        self.metrics.releases.labels("released").inc()

    async def report(
        self, lease_id: str, outcome: str, target: str, detail: str, *, client: str = ""
    ) -> None:
        """Record how the work through the proxy went, while the lease is active."""
        uid = (await self.current(lease_id)).view.proxy_uid
        event = LeaseReported(
            lease_id=lease_id,
            proxy_uid=uid,
            outcome=outcome,
            target=target,
            detail=detail,
            deadline=self.policy.deadline(self.views.server_now()),
            backoff_seconds=self.policy.block_backoff if outcome == BLOCKED else 0.0,
            client=client,
        )
        # A fact that depends on no state: no sequence check; every report is its own event.
        new = NewEvent(event, derive_msg_id("lease-reported", lease_id, str(uuid.uuid4())))
        seq = await self._append_report(subjects.lease(uid), new)
        self.metrics.reports.labels(outcome).inc()
        with contextlib.suppress(StoreUnavailable):
            # Read-your-writes, as far as the log lets: the report is recorded either way.
            await self.view_at(uid, seq)

    async def _append_report(self, aggregate: Aggregate, new: NewEvent) -> int:
        """Append a report, and when the log went away in the middle (the append may or may not
        have been stored), append the same message again until the log answers: JetStream keeps
        one message per msg id, so the retry stores it once and learns whether the first attempt
        did. A report stored after its deadline does not count (the fold ignores it as late), so
        after a doubt the answer is read from the stored record, never assumed."""
        give_up = asyncio.get_running_loop().time() + self.policy.view_timeout
        doubted = False
        while True:
            try:
                result = await self.store.append(aggregate, [new])
                break
            except NotSent:
                # Never sent: a first attempt fails fast (503, nothing stored); after a doubt,
                # the log is merely still away, and the truth is still to be learnt.
                if not doubted or asyncio.get_running_loop().time() >= give_up:
                    raise
                await asyncio.sleep(DOUBT_RETRY)
            except StoreUnavailable:
                if asyncio.get_running_loop().time() >= give_up:
                    raise
                doubted = True
                await asyncio.sleep(DOUBT_RETRY)
        if doubted:
            history = await self.store.read(aggregate, after_seq=result.last_seq - 1)
            stored = next((r for r in history.events if r.msg_id == new.msg_id), None)
            deadline = getattr(new.event, "deadline", None)
            if stored is None or not on_time(deadline, stored.timestamp):
                raise Unavailable(
                    "the report reached the event log after its deadline and was not counted; "
                    "try again",
                    headers={"Retry-After": "1"},
                )
        return result.last_seq
