"""Acquiring, releasing, reporting and expiring leases: compare-and-set appends to ``lease.<uid>``.

A claim is appended with the expected last sequence of the proxy's lease subject set to the one
the view folded. Two replicas that saw the same free proxy cannot both append: the second gets a
conflict and moves on to its next candidate. The answer is given only once this replica's view
shows the claim granted (read-your-writes), so a ``GET`` of the lease right after works here.
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
from events.schemas import LeaseAcquired, LeaseReleased, LeaseReported, Phase
from events.store import EventStore, NewEvent, derive_msg_id
from projections.lease import ACTIVE, LeaseRecord, LeaseView, available_at, find, is_available
from projections.lease import state_of as lease_state
from projections.proxy import ProxyView
from services.discovery.errors import NoProxyAvailable, TtlTooLong, UnknownLease
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
class Granted:
    view: LeaseView
    record: LeaseRecord


def eligible(proxy: ProxyView, selector: Mapping[str, str]) -> bool:
    """Ready, not being deleted, not known unhealthy, and matching every selector pair.

    ``healthy`` is None until a health prober has reported on the proxy: that counts as healthy,
    or nothing could be leased in a system without the prober.
    """
    if proxy.phase is not Phase.READY or proxy.deleting or proxy.removed or not proxy.url:
        return False
    if proxy.healthy is False:
        return False
    attributes = proxy.spec.attributes
    return all(attributes.get(key) == value for key, value in selector.items())


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

    def check_ttl(self, ttl: float | None) -> float:
        if ttl is None:
            return self.policy.default_ttl
        if ttl > self.policy.max_ttl:
            raise TtlTooLong(
                f"ttl_seconds {ttl:g} is longer than this server's maximum lease TTL "
                f"({self.policy.max_ttl:g} s); ask for less, or release and acquire again"
            )
        return ttl

    async def acquire(
        self, selector: Mapping[str, str], ttl_seconds: float | None, holder: str
    ) -> Granted:
        ttl = self.check_ttl(ttl_seconds)
        with self.metrics.acquire_seconds.time():
            matching = [p for p in self.views.all_proxies() if eligible(p, selector)]
            if not matching:
                self.metrics.acquisitions.labels("no_match").inc()
                raise NoProxyAvailable(
                    f"no Ready, healthy proxy matches the selector {dict(selector)}",
                    headers={"Retry-After": "5"},
                )
            granted = await self._try(self._order(matching), selector, ttl, holder)
            if granted is None:
                self.metrics.acquisitions.labels("busy").inc()
                raise NoProxyAvailable(
                    f"{len(matching)} proxies match the selector {dict(selector)}, "
                    "but none is free right now",
                    headers={"Retry-After": str(self._retry_after(matching))},
                )
            self.metrics.acquisitions.labels("acquired").inc()
            return granted

    def _order(self, matching: list[ProxyView]) -> list[str]:
        """Available proxies in random order, so requests and replicas spread out instead of all
        racing for the first one."""
        now = self.views.now()
        uids = [p.uid for p in matching if is_available(self.views.lease_view(p.uid), now)]
        self.rng.shuffle(uids)
        return uids

    async def _try(
        self, uids: list[str], selector: Mapping[str, str], ttl: float, holder: str
    ) -> Granted | None:
        queue = deque(uids)
        fresh: dict[str, LeaseView | None] = {}
        reread: set[str] = set()
        attempts = 0
        while queue and attempts < self.policy.max_attempts:
            uid = queue.popleft()
            view = fresh.pop(uid) if uid in fresh else self.views.lease_view(uid)
            if self._trying[uid] or not is_available(view, self.views.now()):
                # Another request of this replica is claiming it: one claim per replica is
                # enough to race with the other replicas; more would only lose to it.
                continue
            attempts += 1
            self._trying[uid] += 1
            try:
                seq = await self._claim(uid, view, selector, ttl, holder)
                if seq is None:
                    # Lost the race; re-read once: a report, not a claim, may have moved it.
                    self.metrics.conflicts.labels("sequence").inc()
                    if uid not in reread:
                        reread.add(uid)
                        view = await self.views.fresh_lease_view(uid)
                        if is_available(view, self.views.now()):
                            fresh[uid] = view
                            queue.append(uid)
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
        self,
        uid: str,
        view: LeaseView | None,
        selector: Mapping[str, str],
        ttl: float,
        holder: str,
    ) -> tuple[str, int] | None:
        lease_id = str(uuid.uuid4())
        event = LeaseAcquired(
            lease_id=lease_id,
            proxy_uid=uid,
            holder=holder,
            ttl_seconds=ttl,
            selector=dict(selector),
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

    def _retry_after(self, matching: list[ProxyView]) -> int:
        now = self.views.now()
        soonest: datetime | None = None
        for proxy in matching:
            when = available_at(self.views.lease_view(proxy.uid))
            if when is not None and when > now and (soonest is None or when < soonest):
                soonest = when
        if soonest is None:
            return 1
        return max(1, math.ceil((soonest - now).total_seconds()))

    # ------------------------------------------------------------------------ the rest

    def get(self, lease_id: str) -> Granted:
        found = self.views.find_lease(lease_id)
        if found is None:
            raise UnknownLease(f"no lease {lease_id!r} (unknown, or too old to be kept)")
        return Granted(*found)

    async def release(self, lease_id: str) -> Granted:
        """End the lease now; releasing a lease that has already ended changes nothing."""
        granted = self.get(lease_id)
        uid = granted.view.proxy_uid
        view: LeaseView | None = granted.view
        for _ in range(self.policy.max_attempts):
            record = find(view, lease_id)
            if view is None or record is None:
                break
            if view.current is not record or lease_state(record, self.views.now()) != ACTIVE:
                self.metrics.releases.labels("already_ended").inc()
                return Granted(view, record)
            event = LeaseReleased(
                lease_id=lease_id, proxy_uid=uid, cooldown_seconds=self.policy.cooldown
            )
            try:
                result = await self.store.append(
                    subjects.lease(uid),
                    [NewEvent(event, derive_msg_id("lease-released", lease_id))],
                    expected_seq=view.last_seq,
                )
            except ConcurrencyError:
                view = await self.views.fresh_lease_view(uid)
                continue
            self.metrics.releases.labels("released").inc()
            view = await self._view_at(uid, result.last_seq)
            record = find(view, lease_id)
            if view is not None and record is not None:
                return Granted(view, record)
            break
        raise UnknownLease(f"no lease {lease_id!r} (unknown, or too old to be kept)")

    async def report(self, lease_id: str, outcome: str, detail: str) -> Granted:
        """Record how the lease went; allowed after release too (the crawl may end later)."""
        granted = self.get(lease_id)
        uid = granted.view.proxy_uid
        event = LeaseReported(lease_id=lease_id, proxy_uid=uid, outcome=outcome, detail=detail)
        # A fact that depends on no state: no sequence check; every report is its own event.
        result = await self.store.append(
            subjects.lease(uid),
            [NewEvent(event, derive_msg_id("lease-reported", lease_id, str(uuid.uuid4())))],
        )
        self.metrics.report(outcome)
        view = await self._view_at(uid, result.last_seq)
        record = find(view, lease_id)
        return Granted(view, record) if view is not None and record is not None else granted
