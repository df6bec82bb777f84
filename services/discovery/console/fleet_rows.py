"""The live fleet page's rows, kept between requests: a row is rebuilt only when its proxy's or
its lease's view changed, its pool or its address's sharers changed, or its time came (a lease's
end, a cooldown's, a back-off's: ``fleet_page.boundary``).

Views are immutable values replaced on every event, so "changed" is an identity test, and a poll
of 10,000 proxies costs a dictionary look-up per proxy, not a row. Each row carries the cache's
version at which it last differed from the row before: a poll names the version it has, and
gets only the rows changed since (``fleet_page.answer``). The instance id tells a token of this
process from one of another replica or of before a restart: those get the whole table.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from projections.egress import EgressIndex, EgressPolicy
from projections.lease import LeaseView
from projections.proxy import ProxyView
from services.discovery.console.pure.fleet import Row, row
from services.discovery.console.pure.fleet_page import boundary
from services.discovery.pure.egress_shown import shown


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
    seen: int


class FleetRows:
    def __init__(self) -> None:
        self.instance = secrets.token_hex(4)
        self.version = 0
        self._kept: dict[str, _Kept] = {}
        self._pass = 0

    def version_of(self, uid: str) -> int:
        kept = self._kept.get(uid)
        return kept.version if kept is not None else self.version

    def rows(
        self,
        proxies: Iterable[ProxyView],
        leases: Mapping[str, LeaseView],
        now: datetime,
        *,
        pools: Mapping[str, str],
        policy: EgressPolicy,
        index: EgressIndex,
    ) -> list[Row]:
        """``fleet.rows`` of ``proxies`` (in their order), reusing every row still valid."""
        self._pass += 1
        out: list[Row] = []
        kept_rows = self._kept
        for proxy in proxies:
            if not proxy.name or proxy.removed:
                continue
            uid = proxy.uid
            lease = leases.get(uid)
            pool = pools.get(uid, "")
            sharing: tuple[str, ...] = ()
            later = False
            if uid in index.ip_of:
                sharing, later = tuple(index.sharing(uid)), index.later(uid)
            kept = kept_rows.get(uid)
            if (
                kept is None
                or kept.proxy is not proxy
                or kept.lease is not lease
                or kept.pool != pool
                or kept.sharing != sharing
                or kept.later != later
                or (kept.until is not None and now >= kept.until)
            ):
                fresh = row(proxy, lease, now, pool, shown(proxy, policy, sharing, later))
                version = kept.version if kept is not None else 0
                if kept is None or kept.row != fresh:
                    self.version += 1
                    version = self.version
                kept = _Kept(
                    proxy, lease, pool, sharing, later, boundary(lease, now), fresh, version, 0
                )
                kept_rows[uid] = kept
            kept.seen = self._pass
            out.append(kept.row)
        if len(kept_rows) > len(out):
            for uid in [u for u, k in kept_rows.items() if k.seen != self._pass]:
                del kept_rows[uid]
            self.version += 1  # a row gone changes the counts, not any row shown
        return out
