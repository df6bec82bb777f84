"""The fleet page's counts kept as rows change, so a page of the live fleet, filtered by one of
the attributes its form offers, gets its figures and its total without a walk of the fleet
(docs/decisions/0164-a-change-index-for-the-fleet-poll.md).

A ``Tally`` is ``fleet.counts`` of a set of rows, updated by adding and removing one row at a
time. ``FleetTally`` keeps one for the whole fleet and one per value of each filter that names
a single value of a row: phase, health, provider, pool and egress country. Those values are few
(the phases, three healths, the providers, pools and countries the fleet has), so the tallies
are bounded by what the form offers, not by the fleet. A query with two of them, with
attributes (any ``key=value`` pair) or with a name search (any text) has no tally: ``counts``
says None and the caller counts the rows it filtered.
"""

from __future__ import annotations

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


class Tally:
    __slots__ = (
        "available",
        "cooling",
        "countries",
        "flagged",
        "health",
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

    def add(self, r: Row, sign: int = 1) -> None:
        """Count ``r`` in (``sign`` 1) or out (-1)."""
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

    def add(self, r: Row, sign: int = 1) -> None:
        self.whole.add(r, sign)
        for name, value_of in DIMENSIONS.items():
            tallies = self.by[name]
            value = value_of(r)
            tally = tallies.get(value)
            if tally is None:
                tally = tallies[value] = Tally()
            tally.add(r, sign)
            if not tally.n:
                del tallies[value]

    def remove(self, r: Row) -> None:
        self.add(r, -1)

    def counts(self, filters: Filters) -> Counts | None:
        """``fleet.counts`` of the rows ``filters`` keeps, or None when no tally answers it (two
        filters at once, attributes or a name search: the caller filters and counts)."""
        if filters.attributes or filters.search:
            return None
        chosen = [(name, getattr(filters, name)) for name in DIMENSIONS if getattr(filters, name)]
        if not chosen:
            return self.whole.counts(self.whole)
        if len(chosen) > 1:
            return None
        name, value = chosen[0]
        return self.by[name].get(value, _EMPTY).counts(self.whole)
