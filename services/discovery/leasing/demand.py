"""The lease requests naming a pool that this replica could not serve, reported to the log for
the pool controller's autoscaler (docs/pools.md, "Autoscale").

A request that waits for a member counts as waiting while it waits; one answered 503 counts as
refused (``busy``: every member taken; ``scaling``: the pool is still growing). Every
``INTERVAL`` seconds, each pool with any gets a ``PoolDemand`` on ``demand.<pool uid>`` with the
figures of the interval, and a pool whose demand ended gets one more, of nothing, so the
controller need not wait for the report to go stale. ``unserved`` counts distinct holders, so a
crawler retrying every second is one crawler short of a member, not five; and each client for
at most the leases it may still hold when the report is made (its ``maxLeases`` less the leases
it holds then), so a client inventing holder names cannot grow a pool beyond what it could lease:
its leased members and its unserved holders together stay within its limit (D135). The limit a
request carried is not enough: a client refused while it held one lease, then granted another,
counted its refusals against the lease it no longer lacked.

A served crawler must not stay counted until the next report: the controller would see it
leased and unserved at once, and grow the pool by one it never needed (``scaleUpAfter`` is
shorter than ``INTERVAL``). So a waiter that ends and a refused holder that is then granted move
their pool, and the moved pools are reported again at once (``report_moved``, at most every
``SETTLE`` seconds): the figures of the running interval, restated, when they fell.

Bounded: at most ``MAX_HOLDERS`` holders are remembered per pool and interval (the count
saturates), and only pools that exist reach here (the route answers 404 for the others).
A report that fails to append is logged and its figures are folded into the next interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from events import subjects
from events.errors import EventStoreError
from events.pool import PoolDemand
from events.store import EventStore, NewEvent, derive_msg_id

log = structlog.get_logger("egress.discovery")

INTERVAL = 5.0
SETTLE = 0.2
"""How long an early report waits for the others served with the first; the least time between
two early reports."""
MAX_HOLDERS = 10_000
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def default_replica() -> str:
    raw = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return _UNSAFE.sub("-", raw)[:128]


@dataclass(frozen=True, slots=True)
class Asker:
    """Who a request is for: its client, its holder, and the client's ``maxLeases`` (None: no
    limit)."""

    client: str
    holder: str
    limit: int | None = None

    @property
    def who(self) -> tuple[str, str]:
        return (self.client, self.holder)


@dataclass
class _Pool:
    waiting: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(client, holder) -> its requests waiting now."""
    refused: Counter[str] = field(default_factory=Counter)
    """reason -> 503s this interval."""
    holders: set[tuple[str, str]] = field(default_factory=set)
    """(client, holder) refused this interval."""
    limits: dict[str, int | None] = field(default_factory=dict)
    """client -> its ``maxLeases``, as its latest request said."""

    def unserved(self, held: Callable[[str], int]) -> int:
        """Distinct holders unserved, each client for at most the leases it may still hold
        now (``held``: the client's active leases)."""
        waiting = {who for who, n in self.waiting.items() if n > 0}
        per_client = Counter(client for client, _ in waiting | self.holders)
        total = 0
        for client, count in per_client.items():
            limit = self.limits.get(client)
            total += count if limit is None else min(count, max(limit - held(client), 0))
        return total

    def empty(self) -> bool:
        return not +self.waiting and not self.refused


def _none_held(client: str) -> int:
    del client
    return 0


class DemandReporter:
    def __init__(
        self,
        store: EventStore,
        replica: str = "",
        interval: float = INTERVAL,
        *,
        held: Callable[[str], int] = _none_held,
    ) -> None:
        self.store = store
        self.held = held
        """A client's active leases now (``quota.Quota.held``)."""
        self.replica = replica or default_replica()
        self.interval = interval
        self.pools: dict[str, _Pool] = {}
        self.reported: set[str] = set()
        """Pools whose last report said something: they get one of nothing when it ends."""
        self.last: dict[str, tuple[int, int]] = {}
        """pool -> (waiting, unserved) of its last report appended."""
        self.moved: set[str] = set()
        """Pools whose figures may have fallen since their last report."""
        self._wake = asyncio.Event()
        self._round = 0
        self._early = 0

    def _pool(self, uid: str) -> _Pool:
        return self.pools.setdefault(uid, _Pool())

    def waiting(self, uid: str, asker: Asker, delta: int) -> None:
        pool = self._pool(uid)
        pool.limits[asker.client] = asker.limit
        who = asker.who
        if who not in pool.waiting and (delta < 0 or len(pool.waiting) >= MAX_HOLDERS):
            who = (asker.client, "")  # saturated: counted as waiting, as one more holder at most
        pool.waiting[who] += delta
        if pool.waiting[who] <= 0:
            del pool.waiting[who]
        if delta < 0:
            self._moved(uid)

    def served(self, uid: str, asker: Asker) -> None:
        """A holder granted a lease of the pool is no longer short of a member, even if it was
        refused earlier in the interval."""
        pool = self.pools.get(uid)
        if pool is not None and asker.who in pool.holders:
            pool.holders.discard(asker.who)
            self._moved(uid)

    def _moved(self, uid: str) -> None:
        if uid in self.last:
            self.moved.add(uid)
            self._wake.set()

    def refused(self, uid: str, asker: Asker, reason: str) -> None:
        pool = self._pool(uid)
        pool.limits[asker.client] = asker.limit
        pool.refused[reason] += 1
        if len(pool.holders) < MAX_HOLDERS:
            pool.holders.add(asker.who)

    def take(self) -> list[PoolDemand]:
        """The reports of the interval that ends now; the refusals start again from nothing
        (waiting requests go on counting until they end)."""
        reports = []
        self.moved.clear()
        for uid, pool in list(self.pools.items()):
            if pool.empty() and uid not in self.reported:
                del self.pools[uid]
                continue
            reports.append(self._report(uid, pool))
            if pool.empty():
                self.reported.discard(uid)
                del self.pools[uid]
            else:
                self.reported.add(uid)
                pool.refused.clear()
                pool.holders.clear()
                pool.limits = {c: pool.limits.get(c) for c, _ in pool.waiting}
        return reports

    def _report(self, uid: str, pool: _Pool) -> PoolDemand:
        return PoolDemand(
            uid=uid,
            replica=self.replica,
            waiting=sum(pool.waiting.values()),
            refused=dict(pool.refused),
            unserved=pool.unserved(self.held),
            interval_seconds=self.interval,
        )

    def take_moved(self) -> list[PoolDemand]:
        """The running interval's figures of the moved pools whose waiting or unserved fell
        since their last report; nothing starts again (the interval goes on)."""
        reports = []
        for uid in sorted(self.moved):
            pool = self.pools.get(uid)
            if pool is None:
                continue
            report = self._report(uid, pool)
            waiting, unserved = self.last.get(uid, (0, 0))
            if report.waiting < waiting or report.unserved < unserved:
                reports.append(report)
        self.moved.clear()
        return reports

    async def report_once(self) -> int:
        """Append this interval's reports; the number appended."""
        self._round += 1
        return await self._append(self.take(), str(self._round))

    async def report_moved(self) -> int:
        """Append the moved pools' figures now (``take_moved``); the number appended."""
        self._wake.clear()
        self._early += 1
        return await self._append(self.take_moved(), f"{self._round}+{self._early}")

    async def _append(self, reports: list[PoolDemand], round_: str) -> int:
        appended = 0
        for report in reports:
            msg_id = derive_msg_id("pool-demand", self.replica, report.uid, round_)
            try:
                aggregate = subjects.demand(report.uid)
            except subjects.InvalidToken:
                # A pool whose declaration carries a uid no subject can hold (written by hand
                # into the log): its demand cannot be reported, and must not stop the others.
                log.warning("pool demand not reported: its uid is no subject token")
                self.reported.discard(report.uid)
                self.pools.pop(report.uid, None)
                self.last.pop(report.uid, None)
                continue
            try:
                await self.store.append(aggregate, [NewEvent(report, msg_id)])
            except EventStoreError as exc:
                log.warning("pool demand not reported", pool=report.uid, error=str(exc))
                self._again(report)
                continue
            appended += 1
            self.reported.add(report.uid)  # an early report of something gets its end too
            if report.waiting or report.unserved or report.refused:
                self.last[report.uid] = (report.waiting, report.unserved)
            else:
                self.reported.discard(report.uid)
                self.last.pop(report.uid, None)
        return appended

    def _again(self, report: PoolDemand) -> None:
        """A failed report's refusals join the next interval's."""
        pool = self._pool(report.uid)
        pool.refused.update(report.refused)
        self.reported.add(report.uid)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.interval
        while True:
            left = deadline - loop.time()
            if left <= 0:
                deadline = loop.time() + self.interval
                await self.report_once()
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), left)
            if self._wake.is_set():
                await asyncio.sleep(SETTLE)
                await self.report_moved()
