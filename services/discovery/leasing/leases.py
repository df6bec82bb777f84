"""Acquiring leases (``POST /v1/leases``): claims appended to ``lease.<uid>``; what is done with a
lease once granted (read, release, report) is ``held_leases.py``.

A claim is appended with the expected last sequence of the proxy's lease subject set to the one
the view folded. Two replicas that saw the same free proxy cannot both append: the second gets a
conflict and moves on to its next candidate. Every answer is given only once this replica's view
shows the append (read-your-writes), so a ``GET`` of the lease right after works here.

A claim carries a ``deadline`` as every write does (``held_leases.py``): one the log did not
confirm in time is answered 503 and ignored by the fold if it arrives later. An Idempotency-Key
makes a retried claim find the lease its first attempt got (docs/api.md, "Idempotency-Key").
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass

import structlog

from events import subjects
from events.errors import ConcurrencyError, StoreUnavailable
from events.schemas import LeaseAcquired
from events.store import EventStore, NewEvent
from projections.lease import LeaseView
from projections.lease_queries import active, find, is_available
from projections.proxy import ProxyView
from services.discovery.http.access import LeaseLimit
from services.discovery.http.errors import ApiError, IdempotencyKeyMismatch, LeaseEnded, PoolBusy
from services.discovery.leasing.choosing import candidates_of
from services.discovery.leasing.demand import Asker, DemandReporter
from services.discovery.leasing.held_leases import HeldLeases
from services.discovery.leasing.quota import Limit, Quota
from services.discovery.leasing.refusals import refusal
from services.discovery.leasing.waiting import Queue, Waiter
from services.discovery.observability.metrics import DiscoveryMetrics
from services.discovery.pure.acquiring import Acquisition, Move
from services.discovery.pure.candidates import normalized, pairs_of
from services.discovery.pure.drawing import Candidates
from services.discovery.pure.policy import Claim, Granted, LeasePolicy, Stored
from services.discovery.views import Views
from services.runtime.pure.poolref import PoolRef

log = structlog.get_logger("egress.discovery")


def eligible(views: Views, proxy: ProxyView, selector: Mapping[str, str]) -> bool:
    """Leasable (``CandidateIndex.admits``: its egress too; its provider's budget not spent
    today) and matching every selector pair (the attributes and the egress seen)."""
    pairs = pairs_of(proxy)
    wanted = normalized(selector).items()
    return (
        views.candidates.admits(proxy)
        and proxy.spec.provider not in views.spent_providers()
        and all((k, v) in pairs for k, v in wanted)
    )


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """One acquire, its arguments as one value (``Leases.acquire`` says what each means)."""

    selector: Mapping[str, str]
    claim: Claim
    exclude: Collection[str] = ()
    proxy_uid: str | None = None
    wait: float = 0.0
    pool: PoolRef | None = None
    pool_uid: str = ""
    limit: Limit | None = None


class Leases(HeldLeases):
    """Every lease route on one object: acquiring here, the rest inherited (``HeldLeases``), so
    the API, renewal, rotation and the selector metrics all take a ``Leases``."""

    def __init__(
        self,
        store: EventStore,
        views: Views,
        policy: LeasePolicy,
        metrics: DiscoveryMetrics,
        *,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(store, views, policy, metrics)
        self.rng = rng or random.Random()
        self._trying: Counter[str] = Counter()
        self.queue: Queue[Granted] = Queue(views, self._give_back)
        views.on_change = self.queue.changed
        self.quota = Quota(views, policy.view_timeout)
        self.demand = DemandReporter(store, held=self.quota.held)

    async def acquire(
        self,
        selector: Mapping[str, str],
        requested_ttl: float | None,
        holder: str,
        *,
        key: str | None = None,
        exclude: Collection[str] = (),
        proxy_uid: str | None = None,
        target: str = "",
        wait: float = 0.0,
        client: str = "",
        pool: PoolRef | None = None,
        pool_uid: str = "",
        limit: Limit | None = None,
    ) -> Granted:
        """A lease on a proxy matching ``selector``, none of ``exclude``, ``proxy_uid`` if given
        (a sticky session: that proxy or none), and not in back-off for ``target``; waiting up
        to ``wait`` seconds for one to become free (``waiting``). With a ``pool`` (whose
        attribute ``selector`` holds, ``pools.checked_pool``), only in the pool's namespace; a
        request for the pool ``pool_uid`` that waits or is refused counts as its demand, each
        client for at most the leases it may still hold. With a ``limit`` (the client's
        ``maxLeases``), the request holds a place under it while it is served (``quota``); a
        retry of a granted request (the same Idempotency-Key) gets its lease even at the limit."""
        ttl = self.policy.grant_ttl(requested_ttl)
        claim = Claim(dict(selector), ttl, requested_ttl or 0.0, holder, key or "", target, client)
        return await self.serve(
            LeaseRequest(selector, claim, exclude, proxy_uid, wait, pool, pool_uid, limit)
        )

    async def serve(self, request: LeaseRequest) -> Granted:
        """``acquire``, its arguments as one request: what a subclass measures
        (``selector_metrics.MeasuredLeases``)."""
        claim, limit = request.claim, request.limit
        with self.metrics.acquire_seconds.time(), contextlib.ExitStack() as reservation:
            if claim.key:
                found = self._known(claim)
                if found is not None:
                    self.metrics.acquisitions.labels("replayed").inc()
                    return found
            try:
                reservation.enter_context(self.quota.reserve(limit, claim.key))
            except LeaseLimit:
                # A retry whose first attempt was granted on another replica a moment ago.
                found = await self._known_at_log_end(claim) if claim.key else None
                if found is None:
                    raise
                self.metrics.acquisitions.labels("replayed").inc()
                return found
            return await self._reserved(request)

    async def _reserved(self, request: LeaseRequest) -> Granted:
        """``serve``, once the request holds its place under the client's limit: the moves
        ``pure.acquiring`` decides, with the claims, reads, metrics and demand around them."""
        selector, claim, pool, limit = request.selector, request.claim, request.pool, request.limit

        def candidates() -> Candidates:
            return candidates_of(
                self.views, selector, pool=pool, exclude=request.exclude, only=request.proxy_uid
            )

        def refused() -> ApiError:
            return refusal(
                self.views,
                selector,
                exclude=request.exclude,
                only=request.proxy_uid,
                target=claim.target,
                pool=pool,
                who=claim.claimant,
            )

        async def attempt() -> Granted | None:
            matching = candidates()
            if not matching:
                return None
            try:
                async with self.quota.claiming(limit):
                    return await self._try(matching, claim)
            except LeaseLimit:
                # The same key in flight beside this request was granted the lease first.
                found = self._known(claim) if claim.key else None
                if found is None:
                    raise
                return found

        rules = Acquisition.of(request.wait, self.queue.waiting)
        granted = await attempt() if rules.claims_first else None
        error: ApiError | None = None
        done: list[Move] = []
        while granted is None:
            error = error or refused()
            move = rules.after(error.status, done, full=self.queue.full)
            if move is Move.REFUSE:
                self._refused(request, error, rules.result(error.status))
                raise error
            done.append(move)
            if move is Move.CATCH_UP:
                if await self._caught_up():
                    granted, error = await attempt(), None  # released elsewhere a moment ago
            else:
                granted, error = await self._waited(request, candidates, attempt), None
        self.metrics.acquisitions.labels("acquired").inc()
        if request.pool_uid:
            self.demand.served(request.pool_uid, _asker(request))
        return granted

    async def _waited(
        self,
        request: LeaseRequest,
        candidates: Callable[[], Candidates],
        attempt: Callable[[], Awaitable[Granted | None]],
    ) -> Granted | None:
        """``_wait``, the request counted as its pool's demand meanwhile."""
        claim, pool_uid = request.claim, request.pool_uid
        asker = _asker(request)
        if pool_uid:
            self.demand.waiting(pool_uid, asker, 1)
        try:
            return await self._wait(candidates, attempt, claim, request.wait)
        finally:
            if pool_uid:
                self.demand.waiting(pool_uid, asker, -1)

    def _refused(self, request: LeaseRequest, error: ApiError, result: str) -> None:
        self.metrics.acquisitions.labels(result).inc()
        if isinstance(error, PoolBusy):
            self.metrics.pool_busy.labels(str(error.scaling).lower()).inc()
            if request.pool_uid:
                reason = "scaling" if error.scaling else "busy"
                self.demand.refused(request.pool_uid, _asker(request), reason)

    async def _caught_up(self) -> bool:
        """Whether the views moved on by reaching their streams' ends (bounded).

        A 503 is an answer about the whole fleet, so it is given only from views that hold
        every event appended before the request: a crawler that releases on one replica and
        acquires on another at once must get the proxy it just freed, and a proxy found
        healthy a moment ago must count, not a view a few milliseconds behind. Two stream
        reads per would-be 503; a log out of reach leaves the refusal as it was."""
        try:
            return await self.views.reach_log_end(self.policy.view_timeout)
        except StoreUnavailable:
            return False

    async def _wait(
        self,
        candidates: Callable[[], Candidates],
        attempt: Callable[[], Awaitable[Granted | None]],
        claim: Claim,
        seconds: float,
    ) -> Granted | None:
        started = time.monotonic()
        waiter: Waiter[Granted] = Waiter(candidates, claim.target, attempt, claim.claimant)
        self.metrics.waiting.inc()
        try:
            granted = await self.queue.wait(waiter, seconds)
        finally:
            self.metrics.waiting.dec()
        self.metrics.wait_seconds.labels("acquired" if granted else "timeout").observe(
            time.monotonic() - started
        )
        return granted

    async def _give_back(self, granted: Granted) -> None:
        await self.release(granted.record.lease_id)

    def _known(self, claim: Claim) -> Granted | None:
        """The lease an earlier request with the same key got, if the view holds it."""
        found = self.views.find_lease(claim.lease_id)
        if found is None:
            return None
        view, record = found
        if not claim.same_request(record):
            raise IdempotencyKeyMismatch(
                "Idempotency-Key: it was sent before with another body (selector "
                f"{record.selector}, holder {record.holder!r}); use a new key for a new request"
            )
        if active(view, record.lease_id, self.views.now()) is None:
            raise LeaseEnded(
                f"the lease this Idempotency-Key acquired ({record.lease_id}) has ended "
                f"({record.end or 'expired'}); use a new key for a new lease"
            )
        return Granted(view, record)

    async def _known_at_log_end(self, claim: Claim) -> Granted | None:
        """``_known``, once this replica's view holds every lease granted so far."""
        with contextlib.suppress(TimeoutError):
            end = await self.views.lease_log_seq()
            await self.views.wait_for_lease_seq(end, self.policy.view_timeout)
        return self._known(claim)

    async def _try(self, matching: Candidates, claim: Claim) -> Granted | None:
        """Claim free candidates in random order, so requests and replicas spread out instead
        of all racing for the first one, until one is granted or the attempts run out."""
        order = matching.drawn(self.rng)
        again: deque[tuple[str, LeaseView | None]] = deque()
        reread: set[str] = set()
        attempts = 0
        # Msg ids of the key the log has answered for (stored or de-duplicated). A conflict is
        # refused before de-duplication, so its msg id is tried again on the next candidate.
        used = 0
        now = self.views.now()
        while attempts < self.policy.max_attempts:
            if again:
                uid, view = again.popleft()
            elif (uid := next(order, "")) != "":
                view = self.views.lease_view(uid)
            else:
                break
            if self._trying[uid] or not is_available(view, now, claim.target, claim.claimant):
                # Another request of this replica is claiming it: one claim per replica is
                # enough to race with the other replicas; more would only lose to it.
                continue
            attempts += 1
            self._trying[uid] += 1
            try:
                stored = await self._claim(uid, view, claim, used)
                if stored is None:
                    # Lost the race; re-read once: a report, not a claim, may have moved it.
                    self.metrics.conflicts.labels("sequence").inc()
                    if uid not in reread:
                        reread.add(uid)
                        again.append((uid, await self.views.fresh_lease_view(uid)))
                    continue
                used += 1
                if stored.duplicate and claim.key:
                    granted = await self._confirm_key(claim, stored.seq)
                    if granted is None and uid not in reread:
                        reread.add(uid)  # the log kept an earlier claim: this one is untried
                        again.append((uid, view))
                else:
                    granted = await self._confirm_or_doubt(uid, stored, claim)
            finally:
                self._trying[uid] -= 1
                if not self._trying[uid]:
                    del self._trying[uid]
            if granted is not None:
                return granted
            self.metrics.conflicts.labels("refused").inc()
        return None

    async def _claim(
        self, uid: str, view: LeaseView | None, claim: Claim, used: int
    ) -> Stored | None:
        lease_id = claim.lease_id or str(uuid.uuid4())
        event = LeaseAcquired(
            lease_id=lease_id,
            proxy_uid=uid,
            holder=claim.holder,
            ttl_seconds=claim.ttl,
            requested_ttl_seconds=claim.requested_ttl,
            selector=claim.selector,
            fencing_token=(view.fencing_token if view else 0) + 1,
            cooldown_seconds=self.policy.cooldown,
            deadline=self.policy.deadline(self.views.server_now()),
            target=claim.target,
            client=claim.client,
        )
        expected = view.last_seq if view else 0
        try:
            result = await self.store.append(
                subjects.lease(uid),
                [NewEvent(event, claim.msg_id(lease_id, used))],
                expected_seq=expected,
            )
        except ConcurrencyError:
            return None
        except StoreUnavailable:
            if not claim.key:
                # The outcome is unknown and the answer will be 503: withdraw the claim if it
                # was stored after all (``withdraw.py``). With a key, the retry learns it.
                self.withdrawals.doubt(uid, lease_id, expected)
            raise
        return Stored(lease_id, result.last_seq, bool(result.duplicates))

    async def _confirm_or_doubt(self, uid: str, stored: Stored, claim: Claim) -> Granted | None:
        """``_confirm``; when the log goes out of reach between the stored claim and its
        confirmation, the answer will be 503 although the claim is in the log: it is withdrawn
        once the log is back, as when the append itself was in doubt (``withdraw.py``). With a
        key, the retry learns the lease instead."""
        try:
            return await self._confirm(uid, stored.lease_id, stored.seq)
        except StoreUnavailable:
            if not claim.key:
                self.withdrawals.doubt(uid, stored.lease_id, stored.seq - 1)
            raise

    async def _confirm(self, uid: str, lease_id: str, seq: int) -> Granted | None:
        """Wait for the view to include the claim, then see whether the fold granted it."""
        view = await self.view_at(uid, seq)
        record = find(view, lease_id)
        if view is None or record is None:
            log.info("lease claim refused by the fold", proxy_uid=uid, lease_id=lease_id)
            return None
        return Granted(view, record)

    async def _confirm_key(self, claim: Claim, seq: int) -> Granted | None:
        """After a duplicate: the log already holds a claim with this msg id, stored at ``seq``
        by an earlier request with the same key, maybe on another proxy. Its lease, if the fold
        granted it; None if it did not (then the next msg id of the key is tried)."""
        try:
            await self.views.wait_for_lease_seq(seq, self.policy.view_timeout)
        except TimeoutError:
            raise StoreUnavailable(f"the view did not reach sequence {seq} in time") from None
        return self._known(claim)


def _asker(request: LeaseRequest) -> Asker:
    """Who a pool's demand counts the request against."""
    limit = request.limit
    return Asker(request.claim.client, request.claim.holder, limit.max_leases if limit else None)
