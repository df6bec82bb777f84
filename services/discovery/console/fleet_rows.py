"""The live fleet page's rows, kept between requests and brought up to date from discovery's
change index, so a poll costs the changes since the last one, not the fleet
(docs/decisions/0164-a-change-index-for-the-fleet-poll.md).

A row is rebuilt only when its proxy's or its lease's view changed, its pool or its address's
sharers changed (``Views.changes`` names those uids), or its time came (a lease's end, a
cooldown's, a back-off's: ``fleet_page.boundary``, kept in a heap of due times). Each row
carries the version at which it last differed from the row before: a poll names the version it
has, and gets only the rows changed since (``fleet_page.answer``); a poll whose version is still
the newest gets a 204 at once. The counts are kept as rows change (``pure.tally``), and the
rows' order beside them, so a page by name of the whole fleet, or of the rows one filter value
keeps, is a slice. The instance id
tells a token of this process from one of another replica or of before a restart: those get
the whole table.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime

from projections.lease import LeaseView
from projections.pool import PoolView
from projections.proxy import ProxyView
from services.discovery.console.pure.fleet import NO_FILTERS, Counts, Filters, Row, counts, row
from services.discovery.console.pure.fleet_page import Paged, Poll, View, arrange, boundary
from services.discovery.console.pure.pools import listed, membership
from services.discovery.console.pure.tally import FleetTally, Key
from services.discovery.pure.changes import DueTimes
from services.discovery.pure.egress_shown import shown
from services.discovery.views import Views


@dataclass(slots=True)
class _Kept:
    proxy: ProxyView
    lease: LeaseView | None
    pool: str
    sharing: tuple[str, ...]
    later: bool
    until: datetime | None
    row: Row
    version: int


class FleetRows:
    def __init__(self) -> None:
        self.instance = secrets.token_hex(4)
        self.version = 0
        self.pools: list[PoolView] = []
        """Every pool not removed, by namespace and name (the pool filter's choices)."""
        self.tally = FleetTally()
        self._kept: dict[str, _Kept] = {}
        self._members: dict[str, str] = {}
        self._pools_seq = -1
        self._synced = -1
        """The views' change index version read up to (-1: nothing read yet)."""
        self._due = DueTimes()

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def order(self) -> list[Key]:
        """(namespace, name, uid) of every row, sorted (not to be changed)."""
        return self.tally.whole.keys

    def version_of(self, uid: str) -> int:
        kept = self._kept.get(uid)
        return kept.version if kept is not None else self.version

    def sync(self, views: Views, now: datetime) -> None:
        """Rebuild the rows whose views changed since the last call or whose time came."""
        touched: set[str] = set()
        if views.pools.last_seq != self._pools_seq:  # pools are few and change rarely
            self._pools_seq = views.pools.last_seq
            self.pools = listed(views.all_pools())
            before, self._members = self._members, membership(self.pools)
            after = self._members
            touched.update(u for u in before.keys() | after.keys() if before.get(u) != after.get(u))
        changed = views.changes.since(self._synced) if self._synced >= 0 else None
        if changed is None:  # first, or fallen behind what the index keeps: everything
            touched.update(views.proxies.views)
            touched.update(self._kept)
        else:
            touched.update(changed)
        self._synced = views.changes.version
        touched.update(self._due.pop_due(now))
        for uid in touched:
            self._refresh(views, uid, now)

    def _refresh(self, views: Views, uid: str, now: datetime) -> None:
        proxy = views.proxies.views.get(uid)
        kept = self._kept.get(uid)
        if proxy is None or not proxy.name or proxy.removed:
            if kept is not None:
                del self._kept[uid]
                self.tally.remove(kept.row)
                self._due.set(uid, None)
                self.version += 1  # a row gone changes the counts, not any row shown
            return
        lease = views.leases.views.get(uid)
        pool = self._members.get(uid, "")
        index = views.candidates.egress
        sharing: tuple[str, ...] = ()
        later = False
        if uid in index.ip_of:
            sharing, later = tuple(index.sharing(uid)), index.later(uid)
        if (
            kept is not None
            and kept.proxy is proxy
            and kept.lease is lease
            and kept.pool == pool
            and kept.sharing == sharing
            and kept.later == later
            and (kept.until is None or now < kept.until)
        ):
            self._due.set(uid, kept.until)
            return
        policy = views.candidates.policy
        fresh = row(proxy, lease, now, pool, shown(proxy, policy, sharing, later))
        version = kept.version if kept is not None else 0
        if kept is None or kept.row != fresh:
            self.version += 1
            version = self.version
            self.tally.replace(kept.row if kept is not None else None, fresh)
        until = boundary(lease, now)
        self._kept[uid] = _Kept(proxy, lease, pool, sharing, later, until, fresh, version)
        self._due.set(uid, until)

    def quiet(self, before: Poll, where: str) -> bool:
        """Whether a poll naming ``before`` for the query ``where`` has nothing to get: no row
        of this process changed since its token (call ``sync`` first)."""
        return (
            before.instance == self.instance
            and before.version == self.version
            and before.where == where
        )

    def listing(self, filters: Filters, view: View) -> tuple[Paged, Counts]:
        """The page ``view`` asks of the rows ``filters`` keeps, and their counts. By name, the
        whole fleet or one filter value's rows are a slice of their kept order; another sort,
        or a query with no tally (``pure.tally``), walks the rows once (and counts them)."""
        summary = self.tally.counts(filters)
        keys = self.tally.keys(filters)
        if summary is not None and keys is not None and view.sort == "name":
            return self._slice(keys, view), summary
        every = [self._kept[uid].row for _, _, uid in self.order]
        chosen = every if filters == NO_FILTERS else [r for r in every if filters.matches(r)]
        return arrange(chosen, view, presorted=True), summary or counts(chosen, every)

    def _slice(self, order: list[Key], view: View) -> Paged:
        total = len(order)
        pages = max(1, -(-total // view.size))
        page = min(view.page, pages)
        start = (page - 1) * view.size
        if view.descending:
            keys = order[max(0, total - start - view.size) : total - start][::-1]
        else:
            keys = order[start : start + view.size]
        rows = [self._kept[uid].row for _, _, uid in keys]
        return Paged(rows, page, pages, start + 1 if rows else 0)
