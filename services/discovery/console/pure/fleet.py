"""The fleet page's rows, filters and counts: pure functions of the views and an instant.

The live page passes the replica's views and its ``now``; a time travel passes views folded up
to ``at`` and ``at`` itself, so a lease that had expired by then shows as free, as the fold
would have judged it (docs/console.md). A proxy's egress is judged as discovery judges it
(``pure.egress_shown``), with discovery's policy; which proxies share an address comes from
discovery's index when live, and from the proxies shown otherwise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from events.schemas import Phase
from projections import lease_queries
from projections.egress import NO_POLICY, EgressIndex, EgressPolicy
from projections.lease import LeaseView
from projections.lease_queries import leasable
from projections.outcomes import active_backoffs
from projections.proxy import ProxyView
from services.discovery.pure.egress_shown import (
    COUNTRY_UNKNOWN,
    EgressShown,
    country_filter,
    index_of,
    shown_in,
)
from services.runtime.pure.poolref import parse_pool_ref

HEALTHY = "healthy"
UNHEALTHY = "unhealthy"
UNKNOWN = "unknown"
HEALTHS = (HEALTHY, UNHEALTHY, UNKNOWN)
PHASES = tuple(phase.value for phase in Phase)
ATTR_PREFIX = "attr."
MAX_FILTER = 200
"""The longest filter value kept (a longer one matches nothing anyway)."""


class FilterError(ValueError):
    """A query parameter the fleet page cannot use; the message names it and the fix."""


@dataclass(frozen=True, slots=True)
class Row:
    """One proxy as the fleet page shows it at one instant."""

    uid: str
    namespace: str
    name: str
    phase: str
    health: str
    latency_ms: float | None
    health_message: str
    provider: str
    ip: str
    attributes: tuple[tuple[str, str], ...]
    leased: bool
    holder: str
    expires_at: datetime | None
    cooldown_until: datetime | None
    backoffs: tuple[tuple[str, datetime], ...]
    """(target, until) of each back-off still running, the soonest to end first."""
    available: bool
    deleting: bool
    message: str
    pool: str = ""
    """``namespace/name`` of the pool whose member it is (``pure.pools.membership``), or ""."""
    egress: EgressShown | None = None
    """What a site sees of it, and whether that keeps it from being leased; None: nothing yet."""
    created_at: datetime | None = None
    """When it was declared: what the page sorts by age."""

    @property
    def egress_country(self) -> str:
        """The country its egress was seen in; ``unknown`` for none."""
        return self.egress.country_key if self.egress is not None else COUNTRY_UNKNOWN


def health_of(proxy: ProxyView) -> str:
    return UNKNOWN if proxy.healthy is None else (HEALTHY if proxy.healthy else UNHEALTHY)


def row(
    proxy: ProxyView,
    lease: LeaseView | None,
    now: datetime,
    pool: str = "",
    egress: EgressShown | None = None,
) -> Row:
    """``egress``: ``egress_shown.shown`` of the proxy (None: nothing to show)."""
    held_back = egress is not None and bool(egress.not_leasable_because)
    leased = not lease_queries.is_free(lease, now)
    rest = None if leased else lease_queries.available_at(lease)
    current = lease.current if leased and lease is not None else None
    return Row(
        uid=proxy.uid,
        namespace=proxy.namespace,
        name=proxy.name,
        phase=proxy.phase.value,
        health=health_of(proxy),
        latency_ms=proxy.latency_ms if proxy.healthy is not None else None,
        health_message=proxy.health_message,
        provider=proxy.spec.provider,
        ip=proxy.ip,
        attributes=tuple(sorted(proxy.spec.attributes.items())),
        leased=leased,
        holder=current.holder if current is not None else "",
        expires_at=current.expires_at if current is not None else None,
        cooldown_until=rest if rest is not None and rest > now else None,
        backoffs=tuple((b.target, b.until) for b in active_backoffs(lease.reports, now))
        if lease is not None
        else (),
        available=leasable(proxy) and not held_back and lease_queries.is_available(lease, now),
        deleting=proxy.deleting,
        message=proxy.health_message if proxy.healthy is False else proxy.message,
        pool=pool,
        egress=egress,
        created_at=proxy.created_at,
    )


def rows(
    proxies: Iterable[ProxyView],
    leases: Mapping[str, LeaseView],
    now: datetime,
    pools: Mapping[str, str] | None = None,
    *,
    policy: EgressPolicy = NO_POLICY,
    index: EgressIndex | None = None,
) -> list[Row]:
    """Every declared proxy not removed, by namespace and name; ``pools``: uid -> the pool it
    is a member of; ``index``: who shares an address (None: built from ``proxies``)."""
    every = list(proxies)
    found = index if index is not None else index_of(every)
    listed = [p for p in every if p.name and not p.removed]
    listed.sort(key=lambda p: (p.namespace, p.name, p.uid))
    member_of = pools or {}
    return [
        row(p, leases.get(p.uid), now, member_of.get(p.uid, ""), shown_in(p, policy, found))
        for p in listed
    ]


@dataclass(frozen=True, slots=True)
class Filters:
    """The fleet page's query: every given part must match."""

    phase: str = ""
    health: str = ""
    provider: str = ""
    attributes: tuple[tuple[str, str], ...] = ()
    pool: str = ""
    """``namespace/name``: its members only (the proxies the pool planned, not every proxy
    carrying its attribute)."""
    egress_country: str = ""
    """``DE``: proxies whose egress was seen there; ``unknown``: those with no country seen."""
    search: str = ""
    """Text the proxy's ``namespace/name`` contains, in any case (``q=``)."""

    def matches(self, r: Row) -> bool:
        if self.search and self.search not in f"{r.namespace}/{r.name}".casefold():
            return False
        if self.pool and r.pool != self.pool:
            return False
        if self.egress_country and r.egress_country != self.egress_country:
            return False
        if self.phase and r.phase != self.phase:
            return False
        if self.health and r.health != self.health:
            return False
        if self.provider and r.provider != self.provider:
            return False
        have = dict(r.attributes)
        return all(have.get(key) == value for key, value in self.attributes)

    @property
    def attributes_text(self) -> str:
        """The attributes as the form's text field shows them: ``key=value`` pairs."""
        return " ".join(f"{key}={value}" for key, value in self.attributes)

    def query(self) -> list[tuple[str, str]]:
        """The filters as query parameters, to carry into links and the live URL."""
        out = [(k, v) for k, v in (("phase", self.phase), ("health", self.health)) if v]
        if self.provider:
            out.append(("provider", self.provider))
        if self.pool:
            out.append(("pool", self.pool))
        if self.egress_country:
            out.append(("egress_country", self.egress_country))
        if self.attributes:
            out.append(("attrs", self.attributes_text))
        if self.search:
            out.append(("q", self.search))
        return out


NO_FILTERS = Filters()


def _attributes(text: str) -> list[tuple[str, str]]:
    pairs = []
    for part in text.replace(",", " ").split():
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise FilterError(
                f"attrs: {part[:60]!r} is not key=value; write attributes as "
                "country=de tier=gold (space or comma between pairs)"
            )
        pairs.append((key, value))
    return pairs


def parse_filters(query: Iterable[tuple[str, str]], *, allowed: Iterable[str] = ()) -> Filters:
    """``phase=Ready&health=unhealthy&provider=local&pool=crawl/de&egress_country=DE&attrs=country=de``
    -> filters;
    also the API's ``attr.<key>=<value>``. An unknown parameter is an error, not ignored: a
    misspelt filter would otherwise show every proxy. Empty values (a form's "any") are no
    filter."""
    phase = health = provider = pool = egress_country = search = ""
    attributes: list[tuple[str, str]] = []
    other = set(allowed)
    for key, raw in query:
        value = raw.strip()[:MAX_FILTER]
        if key in other:
            continue
        if key.startswith(ATTR_PREFIX) and len(key) > len(ATTR_PREFIX):
            attributes.append((key[len(ATTR_PREFIX) :], value))
        elif key == "attrs":
            attributes += _attributes(value)
        elif key == "phase":
            if value and value.lower() not in {p.lower() for p in PHASES}:
                raise FilterError(
                    f"phase: {value!r} is not a phase; use one of {', '.join(PHASES)}"
                )
            phase = next((p for p in PHASES if p.lower() == value.lower()), "")
        elif key == "health":
            if value and value.lower() not in HEALTHS:
                raise FilterError(f"health: {value!r}; use one of {', '.join(HEALTHS)}")
            health = value.lower()
        elif key == "provider":
            provider = value
        elif key == "q":
            search = value.casefold()
        elif key == "pool":
            pool = _pool(value)
        elif key == "egress_country":
            try:
                egress_country = country_filter(value, key)
            except ValueError as exc:
                raise FilterError(str(exc)) from None
        else:
            raise FilterError(
                f"unknown query parameter {key[:60]!r}; filter with phase=, health=, provider=, "
                "pool=NAMESPACE/NAME, egress_country=DE, attrs=key=value and q=NAME; sort with "
                "sort= and order=, page with page= and size="
            )
    return Filters(phase, health, provider, tuple(attributes), pool, egress_country, search)


def _pool(value: str) -> str:
    if not value:
        return ""
    try:
        return str(parse_pool_ref(value))
    except ValueError as exc:
        raise FilterError(f"pool: {exc}") from None


@dataclass(frozen=True, slots=True)
class Counts:
    """The figures at the top of the page, over the rows shown."""

    shown: int = 0
    total: int = 0
    phases: dict[str, int] = field(default_factory=dict)
    healthy: int = 0
    unhealthy: int = 0
    unknown: int = 0
    leased: int = 0
    available: int = 0
    cooling: int = 0
    providers: tuple[str, ...] = ()
    """Every provider in the fleet, for the filter's choices."""
    pools: tuple[str, ...] = ()
    """Every pool with a member in the fleet, for the filter's choices."""
    egress_flagged: int = 0
    """Rows whose egress does not match, is not verified where it must be, or is shared."""
    egress_countries: tuple[str, ...] = ()
    """Every egress country in the fleet (``unknown`` last, if any has none), for the filter."""


def counts(shown: list[Row], every: list[Row]) -> Counts:
    health = Counter(r.health for r in shown)
    phases = Counter(r.phase for r in shown)
    return Counts(
        shown=len(shown),
        total=len(every),
        phases={p: phases[p] for p in PHASES if phases[p]},
        healthy=health[HEALTHY],
        unhealthy=health[UNHEALTHY],
        unknown=health[UNKNOWN],
        leased=sum(r.leased for r in shown),
        available=sum(r.available for r in shown),
        cooling=sum(r.cooldown_until is not None for r in shown),
        providers=tuple(sorted({r.provider for r in every if r.provider})),
        pools=tuple(sorted({r.pool for r in every if r.pool})),
        egress_flagged=sum(r.egress is not None and bool(r.egress.flag) for r in shown),
        egress_countries=_countries(every),
    )


def _countries(every: list[Row]) -> tuple[str, ...]:
    seen = {r.egress_country for r in every}
    known = sorted(seen - {COUNTRY_UNKNOWN})
    return (*known, COUNTRY_UNKNOWN) if COUNTRY_UNKNOWN in seen else tuple(known)
