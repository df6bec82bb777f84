"""The fleet page's counts and order kept as rows change, so a page of the live fleet, whole or
filtered by one of the values its form offers, gets its rows, figures and total without a walk
of the fleet (docs/decisions/0164-a-change-index-for-the-fleet-poll.md).

A ``Tally`` is ``fleet.counts`` of a set of rows, updated by adding and removing one row at a
time. ``FleetTally`` keeps one for the whole fleet and one per value of each filter that names
a single value of a row: phase, health, provider, pool and egress country, each with the sorted
(namespace, name, uid) of its rows, so a page by name is a slice. Those values are few (the
phases, three healths, the providers, pools and countries the fleet has), so the tallies are
bounded by what the form offers, not by the fleet. A query with two of them, with attributes
(any ``key=value`` pair) or with a name search (any text) has no tally: ``counts`` and ``keys``
say None and the caller walks the rows.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable

from services.discovery.console.pure.fleet import (
    HEALTHY,
    PHASES,
    UNHEALTHY,
    UNKNOWN,
    Counts,
    Filters,
    Row,
)
from services.discovery.pure.egress_shown import COUNTRY_UNKNOWN

Key = tuple[str, str, str]
"""(namespace, name, uid): the rows' order by name."""


class Tally:
    __slots__ = (
        "available",
        "cooling",
        "countries",
        "flagged",
        "health",
        "keys",
        "leased",
        "n",
        "phases",
        "pools",
        "providers",
    )

    def __init__(self) -> None:
        self.n = 0
        self.leased = 0
        self.available = 0
        self.cooling = 0
        self.flagged = 0
        self.phases: Counter[str] = Counter()
        self.health: Counter[str] = Counter()
        self.providers: Counter[str] = Counter()
        self.pools: Counter[str] = Counter()
        self.countries: Counter[str] = Counter()
        self.keys: list[Key] = []
        """The rows' keys, sorted."""

    def add(self, r: Row, sign: int = 1) -> None:
        """Count ``r`` in (``sign`` 1) or out (-1), its key with it."""
        self.count(r, sign)
        key = (r.namespace, r.name, r.uid)
        if sign > 0:
            insort(self.keys, key)
        else:
            del self.keys[bisect_left(self.keys, key)]

    def count(self, r: Row, sign: int) -> None:
        """Count ``r`` in or out, its key left where it is."""
        self.n += sign
        self.leased += sign * r.leased
        self.available += sign * r.available
        self.cooling += sign * (r.cooldown_until is not None)
        self.flagged += sign * (r.egress is not None and bool(r.egress.flag))
        for counter, key in (
            (self.phases, r.phase),
            (self.health, r.health),
            (self.providers, r.provider),
            (self.pools, r.pool),
            (self.countries, r.egress_country),
        ):
            left = counter[key] + sign
            if left:
                counter[key] = left
            else:
                del counter[key]  # a value no row has any more is not offered

    def counts(self, every: Tally) -> Counts:
        """``fleet.counts(shown, every)`` with this tally's rows shown."""
        seen = every.countries
        known = sorted(c for c in seen if c != COUNTRY_UNKNOWN)
        return Counts(
            shown=self.n,
            total=every.n,
            phases={p: self.phases[p] for p in PHASES if self.phases[p]},
            healthy=self.health[HEALTHY],
            unhealthy=self.health[UNHEALTHY],
            unknown=self.health[UNKNOWN],
            leased=self.leased,
            available=self.available,
            cooling=self.cooling,
            providers=tuple(sorted(p for p in every.providers if p)),
            pools=tuple(sorted(p for p in every.pools if p)),
            egress_flagged=self.flagged,
            egress_countries=(*known, COUNTRY_UNKNOWN) if COUNTRY_UNKNOWN in seen else tuple(known),
        )


DIMENSIONS: dict[str, Callable[[Row], str]] = {
    "phase": lambda r: r.phase,
    "health": lambda r: r.health,
    "provider": lambda r: r.provider,
    "pool": lambda r: r.pool,
    "egress_country": lambda r: r.egress_country,
}
"""The filters a tally is kept for: each names one value of a row, matched exactly."""

_EMPTY = Tally()


class FleetTally:
    def __init__(self) -> None:
        self.whole = Tally()
        self.by: dict[str, dict[str, Tally]] = {name: {} for name in DIMENSIONS}

    def add(self, r: Row) -> None:
        self.replace(None, r)

    def remove(self, r: Row) -> None:
        self.replace(r, None)

    def replace(self, old: Row | None, new: Row | None) -> None:
        """``old`` out and ``new`` in; a tally whose value and key both stay only counts, so a
        change of one figure moves no key in any order."""
        same_key = old is not None and new is not None and _key(old) == _key(new)
        self._move(self.whole, old, new, same_key)
        for name, value_of in DIMENSIONS.items():
            tallies = self.by[name]
            before = value_of(old) if old is not None else None
            after = value_of(new) if new is not None else None
            if before is not None and before == after:
                self._move(tallies[before], old, new, same_key)
                continue
            if before is not None and old is not None:
                left = tallies[before]
                left.add(old, -1)
                if not left.n:
                    del tallies[before]
            if after is not None and new is not None:
                joined = tallies.get(after)
                if joined is None:
                    joined = tallies[after] = Tally()
                joined.add(new)

    @staticmethod
    def _move(tally: Tally, old: Row | None, new: Row | None, same_key: bool) -> None:
        if same_key and old is not None and new is not None:
            tally.count(old, -1)
            tally.count(new, 1)
            return
        if old is not None:
            tally.add(old, -1)
        if new is not None:
            tally.add(new)

    def _chosen(self, filters: Filters) -> Tally | None:
        if filters.attributes or filters.search:
            return None
        chosen = [(name, getattr(filters, name)) for name in DIMENSIONS if getattr(filters, name)]
        if not chosen:
            return self.whole
        if len(chosen) > 1:
            return None
        name, value = chosen[0]
        return self.by[name].get(value, _EMPTY)

    def counts(self, filters: Filters) -> Counts | None:
        """``fleet.counts`` of the rows ``filters`` keeps, or None when no tally answers it (two
        filters at once, attributes or a name search: the caller filters and counts)."""
        tally = self._chosen(filters)
        return tally.counts(self.whole) if tally is not None else None

    def keys(self, filters: Filters) -> list[Key] | None:
        """The sorted keys of the rows ``filters`` keeps (not to be changed), or None as for
        ``counts``."""
        tally = self._chosen(filters)
        return tally.keys if tally is not None else None


def _key(r: Row) -> Key:
    return (r.namespace, r.name, r.uid)
