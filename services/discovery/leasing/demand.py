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

Bounded: at most ``MAX_HOLDERS`` holders are remembered per pool and interval (the count
saturates), and only pools that exist reach here (the route answers 404 for the others).
A report that fails to append is logged and its figures are folded into the next interval.
"""

from __future__ import annotations

import asyncio
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
        self._round = 0

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
        for uid, pool in list(self.pools.items()):
            if pool.empty() and uid not in self.reported:
                del self.pools[uid]
                continue
            reports.append(
                PoolDemand(
                    uid=uid,
                    replica=self.replica,
                    waiting=sum(pool.waiting.values()),
                    refused=dict(pool.refused),
                    unserved=pool.unserved(self.held),
                    interval_seconds=self.interval,
                )
            )
            if pool.empty():
                self.reported.discard(uid)
                del self.pools[uid]
            else:
                self.reported.add(uid)
                pool.refused.clear()
                pool.holders.clear()
                pool.limits = {c: pool.limits.get(c) for c, _ in pool.waiting}
        return reports

    async def report_once(self) -> int:
        """Append this interval's reports; the number appended."""
        self._round += 1
        appended = 0
        for report in self.take():
            msg_id = derive_msg_id("pool-demand", self.replica, report.uid, str(self._round))
            try:
                aggregate = subjects.demand(report.uid)
            except subjects.InvalidToken:
                # A pool whose declaration carries a uid no subject can hold (written by hand
                # into the log): its demand cannot be reported, and must not stop the others.
                log.warning("pool demand not reported: its uid is no subject token")
                self.reported.discard(report.uid)
                self.pools.pop(report.uid, None)
                continue
            try:
                await self.store.append(aggregate, [NewEvent(report, msg_id)])
            except EventStoreError as exc:
                log.warning("pool demand not reported", pool=report.uid, error=str(exc))
                self._again(report)
                continue
            appended += 1
        return appended

    def _again(self, report: PoolDemand) -> None:
        """A failed report's refusals join the next interval's."""
        pool = self._pool(report.uid)
        pool.refused.update(report.refused)
        self.reported.add(report.uid)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.report_once()
