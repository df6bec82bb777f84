"""The projections discovery answers from, kept current by three projectors.

``proxies`` folds ``proxy.*.*`` into ``ProxyView``s (the shared fold, whose last verdict also
gives the probe latency and message the API shows); ``leases`` folds ``lease.*`` into
``LeaseView``s and keeps the lease-id index. Both record the newest JetStream timestamp they
applied, which bounds this replica's idea of "now" from below (``now``). ``pools`` folds
``pool.*.*`` into ``PoolView``s (the pool controller's fold), indexed by namespace and name; a
pool's member figures are read off the other two (``pools.py``). Pools are few and small, so
they are folded from the stream at start-up, without snapshots. ``meter`` folds ``meter.*``
into a ``MeterView`` per upstream provider entry (``projections.meter``) and keeps which
providers' budgets each UTC day has spent, so the lease path asks one set, not the stream
(docs/decisions/0162-upstream-budgets.md). ``changes`` gives every proxy whose view, lease view
or address's sharers changed a version, so a reader asks what changed since its last read in time
proportional to the changes (docs/decisions/0164-a-change-index-for-the-fleet-poll.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from bisect import bisect_left, insort
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.js import JetStreamContext

from events import subjects
from events.errors import EventStoreError, StoreUnavailable
from events.store import EventStore, Recorded
from projections import lease as lease_fold
from projections import lease_queries, versions
from projections import meter as meter_fold
from projections import pool as pool_fold
from projections import proxy as proxy_fold
from projections.egress import NO_POLICY, EgressPolicy
from projections.lease import LeaseRecord, LeaseView
from projections.meter import Bytes, MeterView, Spent
from projections.pool import PoolView
from projections.proxy import ProxyView
from services.discovery.pure.candidates import CandidateIndex
from services.discovery.pure.changes import ChangeIndex
from services.runtime.aio import raise_if_cancelled
from services.runtime.eventlog.projector import Projector
from services.runtime.eventlog.snapshots import SnapshotStore, Snapshotter

log = structlog.get_logger("egress.discovery")

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
V = TypeVar("V")
BURST = 4
"""Consecutive non-empty single fetches after which the follower gathers events in windows."""
VIEWS_BUCKET = "egress-discovery-views"
"""The KV bucket of this service's snapshots of its views (docs/architecture.md, "Snapshots")."""
NONE_SPENT: frozenset[str] = frozenset()
WINDOW = 0.002
"""How long one windowed fetch gathers events: the most it delays one, under load."""


async def follow(projector: Projector[V], batch: int) -> None:
    """Keep ``projector`` current with low latency and few requests.

    nats-py's batch fetch returns only when its batch is full or its wait is over. Idle, the
    follower asks for one event at a time with a long wait: it returns the moment an event is
    stored, at one request a second. Once events keep coming, one request per event costs more
    than the rest of reading them (a fifth of a lease's CPU in ``bench.discovery``), so it asks
    for a whole batch with a wait of ``WINDOW``: everything stored within those 2 ms comes in
    one answer, and a backlog in answers of ``batch``. An empty window goes back to single
    fetches.
    """
    streak = 0
    idle = projector.idle_timeout
    while True:
        raise_if_cancelled()  # nats-py can swallow a cancellation inside a fetch
        windowed = streak >= BURST
        projector.batch = batch if windowed else 1
        projector.idle_timeout = WINDOW if windowed else idle
        try:
            got = await projector.step()
        except EventStoreError as exc:
            # NATS is away: the views stay as they are (the API answers 503 to writes) and
            # resume where they stopped once it is back; a service that died here would not.
            log.warning("discovery view cannot read, trying again", error=str(exc))
            got = 0
            await asyncio.sleep(idle)
        streak = (BURST if windowed else streak + 1) if got else 0


async def _snapshots(projector: Projector[V], interval: float) -> None:
    """Write the projector's snapshots every ``interval`` seconds, if it keeps any."""
    if projector.snapshots is not None:
        await Snapshotter(projector, projector.snapshots, interval=interval).run()


class Views:
    def __init__(
        self,
        js: JetStreamContext,
        store: EventStore,
        *,
        batch: int = 1000,
        snapshots: bool = True,
        nc: NATS | None = None,
        egress: EgressPolicy = NO_POLICY,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.js = js
        self.clock = clock
        """Which UTC day it is, for budgets alone (a test moves it to the next day)."""
        self.nc = nc
        """With a connection, the views follow their streams by push (``Projector.follow``),
        which answers read-your-writes waits without a window's delay; without, by pull."""
        self.store = store
        self.on_change: Callable[[], None] = lambda: None
        """Called after each event applied (the waiting queue's wake-up)."""
        self.index: dict[str, str] = {}
        """lease id -> proxy uid, for every lease a lease view holds."""
        self.newest = EPOCH
        self.candidates = CandidateIndex(egress)
        """The proxies a lease request may get, by attribute."""
        self.server_ahead = timedelta(0)
        """How far the server's clock is at least ahead of ours (never below 0): the most any
        event was stamped after we received it. Every sample is a lower bound, so the largest
        is the best one; old events replayed at start-up are far behind and change nothing."""
        self._apply_lease = lease_queries.indexed(self.index)
        bucket = VIEWS_BUCKET
        self.proxies: Projector[ProxyView] = Projector(
            js,
            subjects.PROXY_STREAM,
            "proxy.*.*",
            self._on_proxy,
            batch=batch,
            snapshots=SnapshotStore(js, bucket, "proxy", versions.PROXY, ProxyView)
            if snapshots
            else None,
            restored=self._restored_proxy,
        )
        self.leases: Projector[LeaseView] = Projector(
            js,
            subjects.LEASE_STREAM,
            "lease.*",
            self._on_lease,
            batch=batch,
            snapshots=SnapshotStore(js, bucket, "lease", versions.LEASE, LeaseView)
            if snapshots
            else None,
            restored=self._restored_lease,
        )
        self.pools: Projector[PoolView] = Projector(
            js, subjects.POOL_STREAM, "pool.*.*", self._on_pool, batch=batch
        )
        self.meter: Projector[MeterView] = Projector(
            js,
            subjects.METER_STREAM,
            "meter.*",
            self._on_meter,
            key=meter_fold.provider_of,
            batch=batch,
            snapshots=SnapshotStore(js, bucket, "meter", versions.METER, MeterView)
            if snapshots
            else None,
            restored=self._restored_meter,
        )
        self.spent_on: dict[str, set[str]] = {}
        """UTC day -> the providers whose budget that day's bytes reached."""
        self.pool_index: dict[tuple[str, str], str] = {}
        """(namespace, name) -> uid of the pool of that name not removed."""
        self.batch = batch
        self.caught_up = False
        self.order: list[tuple[str, str, str]] = []
        """(namespace, name, uid) of every proxy not removed, sorted: the listings' stable
        order, kept as views change so a page costs its rows, not a sort of the fleet."""
        self.key_of: dict[str, tuple[str, str, str]] = {}
        """uid -> its key in ``order``."""
        self.changes = ChangeIndex()
        """uid -> the version of its last change: its proxy view, its lease view, or who shares
        its address (the console's fleet rows read it)."""

    def _seen(self, recorded: Recorded) -> None:
        stamp = recorded.timestamp
        self.newest = max(self.newest, stamp)
        self.server_ahead = max(self.server_ahead, stamp - datetime.now(UTC))

    def _on_proxy(self, view: ProxyView | None, recorded: Recorded) -> ProxyView:
        self._seen(recorded)
        after = proxy_fold.apply(view, recorded)
        for uid in self.candidates.update(after):
            self.changes.touch(uid)
        self._order(after)
        self.on_change()
        return after

    def _on_lease(self, view: LeaseView | None, recorded: Recorded) -> LeaseView:
        self._seen(recorded)
        after = self._apply_lease(view, recorded)
        self.changes.touch(after.proxy_uid)
        self.on_change()
        return after

    def _on_pool(self, view: PoolView | None, recorded: Recorded) -> PoolView:
        after = pool_fold.apply(view, recorded)
        where = (after.namespace, after.name)
        if not after.removed:
            self.pool_index[where] = after.uid
        elif self.pool_index.get(where) == after.uid:
            del self.pool_index[where]
        return after

    def _on_meter(self, view: MeterView | None, recorded: Recorded) -> MeterView:
        after = meter_fold.apply(view, recorded)
        self._judge(after, meter_fold.day_of(recorded.timestamp))
        return after

    def _restored_meter(self, provider: str, view: MeterView) -> None:
        del provider
        for day in view.days:
            self._judge(view, day)

    def _judge(self, view: MeterView, day: str) -> None:
        """Note whether ``view``'s provider spent its budget on ``day``, after a record of it
        (a later record may carry a larger budget: then it is no longer spent)."""
        totals = view.days.get(day)
        if totals is not None and totals.spent:
            self.spent_on.setdefault(day, set()).add(view.provider)
            while len(self.spent_on) > meter_fold.MAX_DAYS:
                del self.spent_on[min(self.spent_on)]
        elif day in self.spent_on:
            self.spent_on[day].discard(view.provider)
            if not self.spent_on[day]:
                del self.spent_on[day]

    def _restored_proxy(self, uid: str, view: ProxyView) -> None:
        for touched in self.candidates.update(view):
            self.changes.touch(touched)
        self.changes.touch(uid)
        self._order(view)

    def _order(self, view: ProxyView) -> None:
        key = None if view.removed else (view.namespace, view.name, view.uid)
        old = self.key_of.get(view.uid)
        if old == key:
            return
        if old is not None:
            del self.order[bisect_left(self.order, old)]
            del self.key_of[view.uid]
        if key is not None:
            insort(self.order, key)
            self.key_of[view.uid] = key

    def _restored_lease(self, uid: str, view: LeaseView) -> None:
        self.changes.touch(uid)
        for lease_id in lease_queries.lease_ids(view):
            self.index[lease_id] = uid
        if view.updated_at is not None:
            self.newest = max(self.newest, view.updated_at)

    # ------------------------------------------------------------------------------ running

    async def catch_up(self) -> None:
        await self.proxies.catch_up()
        await self.leases.catch_up()
        await self.pools.catch_up()
        await self.meter.catch_up()
        self.caught_up = True

    async def run(self, snapshot_interval: float = 30.0) -> None:
        async with asyncio.TaskGroup() as group:
            if self.nc is not None:
                group.create_task(self.proxies.follow(self.nc), name="discovery-proxies")
                group.create_task(self.leases.follow(self.nc), name="discovery-leases")
                group.create_task(self.pools.follow(self.nc), name="discovery-pools")
                group.create_task(self.meter.follow(self.nc), name="discovery-meter")
            else:
                group.create_task(follow(self.proxies, self.batch), name="discovery-proxies")
                group.create_task(follow(self.leases, self.batch), name="discovery-leases")
                group.create_task(follow(self.pools, self.batch), name="discovery-pools")
                group.create_task(follow(self.meter, self.batch), name="discovery-meter")
            if snapshot_interval > 0:
                group.create_task(_snapshots(self.proxies, snapshot_interval))
                group.create_task(_snapshots(self.leases, snapshot_interval))
                group.create_task(_snapshots(self.meter, snapshot_interval))

    async def close(self) -> None:
        await self.proxies.close()
        await self.leases.close()
        await self.pools.close()
        await self.meter.close()

    # ---------------------------------------------------------------------------- questions

    def now(self) -> datetime:
        """This replica's best idea of the server's time: the local clock, but never earlier
        than the newest JetStream timestamp seen. Only a hint for choosing candidates and for
        showing states: whether a claim holds is decided by the fold, on the claim's own
        timestamp."""
        return max(datetime.now(UTC), self.newest)

    def server_now(self) -> datetime:
        """The local clock corrected by how far the server's is known to be ahead: what a
        writer's deadline is measured in, since the fold compares it with the JetStream
        timestamp of the event (docs/api.md, "When NATS is unreachable")."""
        return datetime.now(UTC) + self.server_ahead

    def proxy(self, uid: str) -> ProxyView | None:
        return self.proxies.views.get(uid)

    def all_proxies(self) -> list[ProxyView]:
        return list(self.proxies.views.values())

    def spent_providers(self) -> AbstractSet[str]:
        """The providers whose budget today's bytes have reached: their proxies are not leased.
        One look-up, whatever the fleet or the stream (the lease path asks it per request), and
        not even the clock while no budget was spent in the days the view keeps."""
        if not self.spent_on:
            return NONE_SPENT
        return self.spent_on.get(meter_fold.day_of(self.clock()), NONE_SPENT)

    def budget_spent(self, proxy: ProxyView) -> Spent | None:
        """Why the proxy's provider may not lease it today, or None."""
        provider = proxy.spec.provider
        if provider not in self.spent_providers():
            return None
        return meter_fold.spent(self.meter.views.get(provider), self.clock())

    def bytes_today(self, proxy: ProxyView) -> Bytes:
        """What the proxy moved today, as its provider's meter counts it (a proxy of a provider
        with no records costs one look-up: a listing of the fleet asks it per proxy)."""
        view = self.meter.views.get(proxy.spec.provider)
        if view is None:
            return Bytes()
        return meter_fold.bytes_on(view, proxy.uid, meter_fold.day_of(self.clock()))

    def pool(self, namespace: str, name: str) -> PoolView | None:
        uid = self.pool_index.get((namespace, name))
        return self.pools.views.get(uid) if uid is not None else None

    def all_pools(self) -> list[PoolView]:
        """Every pool not removed, by namespace and name."""
        found = (self.pools.views.get(uid) for uid in self.pool_index.values())
        return sorted((p for p in found if p is not None), key=lambda p: (p.namespace, p.name))

    async def reach_pool_log_end(self, timeout: float) -> None:
        """Bring the pool views to the POOL stream's end as it is now (bounded by ``timeout``):
        what a 404 for a pool is answered after, so a pool declared a moment ago is found."""
        end = await self._log_seq(subjects.POOL_STREAM)
        with contextlib.suppress(TimeoutError):
            await self.pools.wait_for(end, timeout)

    def lease_view(self, uid: str) -> LeaseView | None:
        return self.leases.views.get(uid)

    def find_lease(self, lease_id: str) -> tuple[LeaseView, LeaseRecord] | None:
        uid = self.index.get(lease_id)
        view = self.leases.views.get(uid) if uid else None
        record = lease_queries.find(view, lease_id)
        return None if view is None or record is None else (view, record)

    def active_leases(self) -> list[LeaseView]:
        return [v for v in self.leases.views.values() if v.current is not None]

    @property
    def lease_seq(self) -> int:
        """The stream sequence of the last lease event applied."""
        return self.leases.last_seq

    async def wait_for_lease_seq(self, seq: int, timeout: float) -> None:
        """Until the lease views include stream sequence ``seq`` (read-your-writes)."""
        await self.leases.wait_for(seq, timeout)

    async def reach_log_end(self, timeout: float) -> bool:
        """Bring both views to their streams' ends as they are now (bounded by ``timeout``);
        whether either moved. What a refusal about the whole fleet is answered after."""
        before = (self.proxies.last_seq, self.lease_seq)
        proxy_end, lease_end = await asyncio.gather(
            self._log_seq(subjects.PROXY_STREAM), self.lease_log_seq()
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.proxies.wait_for(proxy_end, timeout)
                await self.wait_for_lease_seq(lease_end, timeout)
        return (self.proxies.last_seq, self.lease_seq) != before

    async def _log_seq(self, stream: str) -> int:
        try:
            info = await self.js.stream_info(stream)
        except (NatsError, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot read the {stream} stream: {exc}") from exc
        return info.state.last_seq

    async def lease_log_seq(self) -> int:
        """The LEASE stream's last sequence now: what this view must reach to know every lease
        any replica has granted so far."""
        return await self._log_seq(subjects.LEASE_STREAM)

    async def fresh_lease_view(self, uid: str) -> LeaseView | None:
        """The lease view with whatever the projector has not applied yet read from the store:
        exact after a conflict, without waiting for the projector."""
        view = self.lease_view(uid)
        after = view.last_seq if view is not None else 0
        history = await self.store.read(subjects.lease(uid), after_seq=after)
        if view is not None and after > 0 and not history.events:
            # Nothing newer, yet the append conflicted: the subject's last event may have aged
            # out of the stream (with all before it), and JetStream then expects sequence 0.
            last = await self.store.read(subjects.lease(uid), after_seq=after - 1)
            if last.last_seq < after:
                return msgspec.structs.replace(view, last_seq=0)
        return lease_fold.fold(history.events, view)
