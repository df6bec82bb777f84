"""Acquiring, releasing and reporting on leases: appends to ``lease.<uid>``.

A claim is appended with the expected last sequence of the proxy's lease subject set to the one
the view folded. Two replicas that saw the same free proxy cannot both append: the second gets a
conflict and moves on to its next candidate. Every answer is given only once this replica's view
shows the append (read-your-writes), so a ``GET`` of the lease right after works here.

Only active leases are served: a released or expired lease answers like an unknown one.
"""

from __future__ import annotations

import math
import random
import uuid
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import structlog

from events import subjects
from events.errors import ConcurrencyError
from events.schemas import LeaseAcquired, LeaseReleased, LeaseReported
from events.store import EventStore, NewEvent, derive_msg_id
from projections.lease import (
    RELEASED,
    LeaseRecord,
    LeaseView,
    active,
    available_at,
    find,
    is_available,
)
from projections.proxy import ProxyView
from services.discovery.candidates import leasable, random_order
from services.discovery.errors import NoProxyAvailable, UnknownLease
from services.discovery.metrics import DiscoveryMetrics
from services.discovery.views import Views

log = structlog.get_logger("egress.discovery")

DEFAULT_TTL = 300.0


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    max_ttl: float = 3600.0
    cooldown: float = 10.0
    max_attempts: int = 16
    """Claims one request tries before answering busy: bounds the work under heavy contention."""
    view_timeout: float = 5.0

    @property
    def default_ttl(self) -> float:
        return min(DEFAULT_TTL, self.max_ttl)


@dataclass(frozen=True, slots=True)
class Claim:
    """What one acquire request asks for, as it goes into each ``LeaseAcquired`` it tries."""

    selector: dict[str, str]
    ttl: float
    requested_ttl: float
    holder: str


@dataclass(frozen=True, slots=True)
class Granted:
    view: LeaseView
    record: LeaseRecord


def eligible(proxy: ProxyView, selector: Mapping[str, str]) -> bool:
    """Leasable (``candidates.leasable``) and matching every selector pair."""
    attributes = proxy.spec.attributes
    return leasable(proxy) and all(attributes.get(k) == v for k, v in selector.items())


class Leases:
    def __init__(
        self,
        store: EventStore,
        views: Views,
        policy: LeasePolicy,
        metrics: DiscoveryMetrics,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.views = views
        self.policy = policy
        self.metrics = metrics
        self.rng = rng or random.Random()
        self._trying: Counter[str] = Counter()

    # ------------------------------------------------------------------------------ acquire

    def grant_ttl(self, requested: float | None) -> float:
        """The TTL granted: the default when none is asked for, never above the maximum. A
        longer request is clamped, not refused: the holder gets the longest lease it may have
        and learns so from ``ttlClamped``, where a refusal would only make it ask again."""
        if requested is None:
            return self.policy.default_ttl
        return min(requested, self.policy.max_ttl)

    async def acquire(
        self, selector: Mapping[str, str], requested_ttl: float | None, holder: str
    ) -> Granted:
        ttl = self.grant_ttl(requested_ttl)
        with self.metrics.acquire_seconds.time():
            matching = self.views.candidates.matching(selector)
            if not matching:
                self.metrics.acquisitions.labels("no_match").inc()
                raise NoProxyAvailable(
                    f"no Ready, healthy proxy matches the selector {dict(selector)}",
                    headers={"Retry-After": "5"},
                )
            claim = Claim(dict(selector), ttl, requested_ttl or 0.0, holder)
            granted = await self._try(matching, claim)
            if granted is None:
                self.metrics.acquisitions.labels("busy").inc()
                raise NoProxyAvailable(
                    f"{len(matching)} proxies match the selector {dict(selector)}, "
                    "but none is free right now",
                    headers={"Retry-After": str(self._retry_after(matching))},
                )
            self.metrics.acquisitions.labels("acquired").inc()
            return granted

    async def _try(self, matching: list[str], claim: Claim) -> Granted | None:
        """Claim free candidates in random order, so requests and replicas spread out instead
        of all racing for the first one, until one is granted or the attempts run out."""
        order = random_order(matching, self.rng)
        again: deque[tuple[str, LeaseView | None]] = deque()
        reread: set[str] = set()
        attempts = 0
        now = self.views.now()
        while attempts < self.policy.max_attempts:
            if again:
                uid, view = again.popleft()
            elif (uid := next(order, "")) != "":
                view = self.views.lease_view(uid)
            else:
                break
            if self._trying[uid] or not is_available(view, now):
                # Another request of this replica is claiming it: one claim per replica is
                # enough to race with the other replicas; more would only lose to it.
                continue
            attempts += 1
            self._trying[uid] += 1
            try:
                seq = await self._claim(uid, view, claim)
                if seq is None:
                    # Lost the race; re-read once: a report, not a claim, may have moved it.
                    self.metrics.conflicts.labels("sequence").inc()
                    if uid not in reread:
                        reread.add(uid)
                        again.append((uid, await self.views.fresh_lease_view(uid)))
                    continue
                lease_id, last_seq = seq
                granted = await self._confirm(uid, lease_id, last_seq)
            finally:
                self._trying[uid] -= 1
                if not self._trying[uid]:
                    del self._trying[uid]
            if granted is not None:
                return granted
            self.metrics.conflicts.labels("refused").inc()
        return None

    async def _claim(
        self, uid: str, view: LeaseView | None, claim: Claim
    ) -> tuple[str, int] | None:
        lease_id = str(uuid.uuid4())
        event = LeaseAcquired(
            lease_id=lease_id,
            proxy_uid=uid,
            holder=claim.holder,
            ttl_seconds=claim.ttl,
            requested_ttl_seconds=claim.requested_ttl,
            selector=claim.selector,
            fencing_token=(view.fencing_token if view else 0) + 1,
            cooldown_seconds=self.policy.cooldown,
        )
        try:
            result = await self.store.append(
                subjects.lease(uid),
                [NewEvent(event, derive_msg_id("lease-acquired", lease_id))],
                expected_seq=view.last_seq if view else 0,
            )
        except ConcurrencyError:
            return None
        return lease_id, result.last_seq

    async def _confirm(self, uid: str, lease_id: str, seq: int) -> Granted | None:
        """Wait for the view to include the claim, then see whether the fold granted it."""
        view = await self._view_at(uid, seq)
        record = find(view, lease_id)
        if view is None or record is None:
            log.info("lease claim refused by the fold", proxy_uid=uid, lease_id=lease_id)
            return None
        return Granted(view, record)

    async def _view_at(self, uid: str, seq: int) -> LeaseView | None:
        try:
            await self.views.wait_for_lease_seq(seq, self.policy.view_timeout)
        except TimeoutError:
            # The projector lags: answer from the log itself rather than not at all.
            log.warning("lease view lags, reading the log", proxy_uid=uid, seq=seq)
            return await self.views.fresh_lease_view(uid)
        return self.views.lease_view(uid)

    def _retry_after(self, matching: list[str]) -> int:
        now = self.views.now()
        soonest: datetime | None = None
        for uid in matching:
            when = available_at(self.views.lease_view(uid))
            if when is not None and when > now and (soonest is None or when < soonest):
                soonest = when
        if soonest is None:
            return 1
        return max(1, math.ceil((soonest - now).total_seconds()))

    # ------------------------------------------------------------------------ the rest

    def get(self, lease_id: str) -> Granted:
        """The lease while it holds its proxy. Released and expired leases are answered like
        unknown ones: the API deals in leases a client can still use, and the log keeps the
        rest (``egress-proxies events --stream LEASE``)."""
        found = self.views.find_lease(lease_id)
        record = active(found[0], lease_id, self.views.now()) if found else None
        if found is None or record is None:
            raise UnknownLease(f"no active lease {lease_id!r} (unknown, released or expired)")
        return Granted(found[0], record)

    async def release(self, lease_id: str) -> None:
        """End the lease now; the proxy cools down before its next lease.

        No sequence check: the fold ends the lease only if it is still the current one and not
        past its end, so a release can never end anything but its own lease, and the msg id
        makes a retried append harmless. The answer says what the fold made of it.
        """
        uid = self.get(lease_id).view.proxy_uid
        event = LeaseReleased(
            lease_id=lease_id, proxy_uid=uid, cooldown_seconds=self.policy.cooldown
        )
        result = await self.store.append(
            subjects.lease(uid), [NewEvent(event, derive_msg_id("lease-released", lease_id))]
        )
        record = find(await self._view_at(uid, result.last_seq), lease_id)
        if record is None or record.end != RELEASED:
            self.metrics.releases.labels("unknown").inc()
            raise UnknownLease(f"no active lease {lease_id!r} (it expired before the release)")
        self.metrics.releases.labels("released").inc()

    async def report(self, lease_id: str, outcome: str, target: str, detail: str) -> None:
        """Record how the work through the proxy went, while the lease is active."""
        uid = self.get(lease_id).view.proxy_uid
        event = LeaseReported(
            lease_id=lease_id, proxy_uid=uid, outcome=outcome, target=target, detail=detail
        )
        # A fact that depends on no state: no sequence check; every report is its own event.
        result = await self.store.append(
            subjects.lease(uid),
            [NewEvent(event, derive_msg_id("lease-reported", lease_id, str(uuid.uuid4())))],
        )
        self.metrics.reports.labels(outcome).inc()
        await self._view_at(uid, result.last_seq)  # a GET right after shows the report
