"""What the console reads from the log itself: a proxy's events, a pool's events, and the fleet
(its pools too) at an instant.

The live fleet and pools pages need no read: they show the replica's views. A time travel folds
the POOL, PROXY and LEASE streams up to the instant into fresh views with the services' own folds,
each from its nearest checkpoint before the instant (``services.runtime.eventlog.checkpoints``).
That costs decoding the checkpoints and folding what came after them (up to 10,000 events per
stream), or a replay from the first event where there is none, so a replica runs one at a
time, at most ``QUEUE`` wait their turn, and one client has at most ``PER_CLIENT`` reads of the
log under way (``Busy`` beyond: the page answers 429 with ``Retry-After``). A read is folded
between awaits, a batch at a time, so cancelling it (its client went away) stops it within one
batch (docs/decisions/0095-the-console-and-the-api-bound.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime

from nats.js import JetStreamContext

from events import subjects
from events.store import Recorded
from projections import lease as lease_fold
from projections import proxy as proxy_fold
from projections.lease import LeaseView
from projections.pool import PoolView
from projections.proxy import ProxyView
from projections.traffic import Scope
from services.discovery.console import traffic_read
from services.discovery.console.pure.timeline import Line, line
from services.discovery.console.pure.traffic import Series
from services.runtime.eventlog import checkpoints
from services.runtime.eventlog.asof import MAX_EVENTS, ByProxy, read_until
from services.runtime.eventlog.checkpoints import fold_at

QUEUE = 8
"""Fleet time travels one replica holds at once, the one running included."""
PER_CLIENT = 2
"""Reads of the log (time travels and proxy timelines) one client has under way at once."""
MAX_RETRY_AFTER = 60


class Busy(Exception):
    """The replica's queue of time travels, or the client's share of it, is full."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Admission:
    """Who may start a read of the log now: bounded per replica and per client.

    Counted, not queued, so a refusal costs nothing: the only waiting is for the one turn a
    fleet time travel takes, and a waiter cancelled there (its client left) leaves the queue.
    Keys are what ``routes._client_key`` makes of a request; they are forgotten at zero, so the
    table is as large as the clients with a read under way.
    """

    def __init__(self, *, queue: int = QUEUE, per_client: int = PER_CLIENT) -> None:
        self.queue = queue
        self.per_client = per_client
        self.travels = 0
        self.by_client: Counter[str] = Counter()
        self._turn = asyncio.Semaphore(1)
        self._last_seconds = 1.0

    def _retry_after(self, ahead: int) -> int:
        """About when the reads ahead will be done, from how long the last travel took."""
        return max(1, min(MAX_RETRY_AFTER, math.ceil(self._last_seconds * max(ahead, 1))))

    @contextlib.asynccontextmanager
    async def admit(self, client: str, *, travel: bool) -> AsyncIterator[None]:
        """Hold a place for one read by ``client``; a fleet ``travel`` also waits its turn."""
        if self.by_client[client] >= self.per_client:
            raise Busy(
                f"this client already has {self.per_client} reads of the event log under way; "
                "wait for them (a page left open polls on its own) or close other console tabs",
                self._retry_after(self.by_client[client]),
            )
        if travel and self.travels >= self.queue:
            raise Busy(
                f"{self.queue} time travels are queued on this replica; try again later",
                self._retry_after(self.travels),
            )
        self.by_client[client] += 1
        self.travels += travel
        started = time.monotonic()
        try:
            if travel:
                async with self._turn:
                    started = time.monotonic()
                    yield
                    self._last_seconds = time.monotonic() - started
            else:
                yield
        finally:
            self.travels -= travel
            self.by_client[client] -= 1
            if self.by_client[client] <= 0:
                del self.by_client[client]


@dataclass(frozen=True, slots=True)
class Cost:
    """What a read of the log cost, shown on the page."""

    events: int
    seconds: float
    notes: tuple[str, ...] = ()
    checkpoints: tuple[tuple[str, int], ...] = ()
    """Per stream, the sequence of the checkpoint a time travel folded from (0: none, from the
    first event): ``events`` counts only what was read after it."""


@dataclass(frozen=True, slots=True)
class FleetAt:
    proxies: dict[str, ProxyView]
    leases: dict[str, LeaseView]
    cost: Cost
    pools: dict[str, PoolView] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PoolHistory:
    events: list[Recorded]
    """Every event of the pool's aggregate up to the instant, in stream order."""
    cost: Cost


@dataclass(frozen=True, slots=True)
class ProxyHistory:
    proxy: ProxyView | None
    lease: LeaseView | None
    lines: list[Line] = field(default_factory=list)
    cost: Cost = Cost(0, 0.0)


def _aged_out(first_seq: int) -> tuple[str, ...]:
    """A note when the LEASE stream no longer starts at sequence 1: it keeps 7 days, so an
    instant before then shows fewer leases than there were (docs/architecture.md, "Streams")."""
    if first_seq <= 1:
        return ()
    return (
        f"the {subjects.LEASE_STREAM} stream keeps 7 days: leases and reports older than that "
        "are no longer in the log and not shown",
    )


class History:
    def __init__(
        self, js: JetStreamContext, *, limit: int = MAX_EVENTS, admission: Admission | None = None
    ) -> None:
        self.js = js
        self.limit = limit
        self.admission = admission or Admission()

    async def _first_seq(self, stream: str) -> int:
        try:
            info = await self.js.stream_info(stream)
        except Exception:
            return 1
        return int(info.state.first_seq or 1)

    async def fleet_at(self, at: datetime, client: str = "") -> FleetAt:
        """Every pool, proxy and lease view as folded from the log up to ``at`` (the pools
        say which proxies are whose members). Raises ``Busy`` when the replica's queue or
        ``client``'s share is full."""
        async with self.admission.admit(client, travel=True):
            started = time.monotonic()
            pools = await fold_at(self.js, checkpoints.POOL, at, limit=self.limit)
            proxies = await fold_at(self.js, checkpoints.PROXY, at, limit=self.limit)
            leases = await fold_at(self.js, checkpoints.LEASE, at, limit=self.limit)
            cost = Cost(
                pools.read + proxies.read + leases.read,
                time.monotonic() - started,
                _aged_out(leases.origin),
                checkpoints=(
                    (subjects.POOL_STREAM, pools.checkpoint),
                    (subjects.PROXY_STREAM, proxies.checkpoint),
                    (subjects.LEASE_STREAM, leases.checkpoint),
                ),
            )
            return FleetAt(proxies.views, leases.views, cost, pools.views)

    async def proxy(self, uid: str, until: datetime | None, client: str = "") -> ProxyHistory:
        """One proxy's events up to ``until`` (None: all of them), and its views then.

        Each of its literal subjects is read on its own, all at once: a read filtered by the
        wildcard ``proxy.<uid>.>`` would cost the server a scan of the whole stream
        (docs/architecture.md, "Reads"). It does not wait for a fleet's time travel, but counts
        in ``client``'s share.
        """
        async with self.admission.admit(client, travel=False):
            return await self._proxy(uid, until)

    async def _proxy(self, uid: str, until: datetime | None) -> ProxyHistory:
        started = time.monotonic()
        reads = [
            read_until(self.js, aggregate.stream, subject, until, limit=self.limit)
            for aggregate in (subjects.proxy(uid), subjects.lease(uid))
            for subject in aggregate.literal_subjects
        ]
        got = await asyncio.gather(*reads)
        first = await self._first_seq(subjects.LEASE_STREAM)
        proxies = ByProxy(proxy_fold.apply, subjects.PROXY_STREAM)
        leases = ByProxy(lease_fold.apply, subjects.LEASE_STREAM)
        lines = []
        for stream, views in ((subjects.PROXY_STREAM, proxies), (subjects.LEASE_STREAM, leases)):
            items = sorted(
                (item for read in got if read.stream == stream for item in read.items),
                key=lambda stored: stored.recorded.seq,
            )
            for stored in items:  # in stream order, as the services fold them
                views.fold(stored)
                lines.append(line(stored.recorded, stream, stored.trace_id))
        cost = Cost(sum(read.read for read in got), time.monotonic() - started, _aged_out(first))
        return ProxyHistory(proxies.views.get(uid), leases.views.get(uid), lines, cost)

    async def pool(self, uid: str, until: datetime | None, client: str = "") -> PoolHistory:
        """Every event of one pool's aggregate up to ``until`` (None: all of them), in stream
        order: its scaling timeline. Each literal subject is read on its own, as for a proxy
        (docs/architecture.md, "Reads"); counts in ``client``'s share."""
        async with self.admission.admit(client, travel=False):
            started = time.monotonic()
            reads = [
                read_until(self.js, subjects.POOL_STREAM, subject, until, limit=self.limit)
                for subject in subjects.pool(uid).literal_subjects
            ]
            got = await asyncio.gather(*reads)
            events = sorted(
                (item.recorded for read in got for item in read.items), key=lambda r: r.seq
            )
            cost = Cost(sum(read.read for read in got), time.monotonic() - started)
            return PoolHistory(events, cost)

    async def traffic(
        self, subject: str, scope: Scope, got: Series, client: str = ""
    ) -> traffic_read.TrafficRead:
        """The gateway's records of ``subject`` in ``scope``'s range (``traffic_read``): at most
        ``traffic_read.MAX_RECORDS``; counts in ``client``'s share like a proxy's timeline."""
        async with self.admission.admit(client, travel=False):
            return await traffic_read.read(
                self.js, subject, scope, got, limit=traffic_read.MAX_RECORDS
            )
