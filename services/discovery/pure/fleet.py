"""The fleet at one instant, counted from discovery's views for the gauges a scrape shows.

Pure and written for speed: a scrape runs ``count_fleet`` and ``count_egress`` on the event
loop, over every proxy (10,000 in about 10 ms), and the event path pays nothing for the metrics
(docs/decisions/0086-fleet-metrics-are-counted-from.md). ``services.discovery.observability.fleet``
reads the views and shows the counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from events.schemas import Phase
from projections import egress
from projections.egress import MISMATCH, EgressIndex, EgressPolicy
from projections.lease import LeaseView
from projections.lease_queries import available_at, leasable
from projections.proxy import ProxyView

PROXY_GAUGES: Mapping[str, str] = {
    "healthy": "Proxies that can be leased: Ready, found healthy by the health service, not "
    "being deleted",
    "unhealthy": "Proxies the health service last found unhealthy (any phase)",
    "leased": "Proxies a lease holds now",
    "available": "Proxies a lease request would get now: healthy, free and past their cooldown "
    "(back-offs are per target and not counted here)",
    "cooling_down": "Proxies no lease holds that rest after one ended (--lease-cooldown)",
    "backoff": "Proxies in back-off for at least one target after `blocked` reports",
}
"""``egress_proxies_<name>{provider}``, each counted by ``FleetCounts``."""

EGRESS_GAUGES: Mapping[str, str] = {
    "egress_mismatch": "Proxies whose egress (what a site sees) does not match their expectation "
    "(spec.egress.expect, --egress-country-attribute): not leased",
    "egress_shared": "Proxies that leave through a public address another proxy leaves through too",
}
"""``egress_proxies_<name>{provider}``, each counted by ``EgressCounts``
(docs/decisions/0111-verified-egress.md)."""
UNKNOWN_COUNTRY = "unknown"


@dataclass
class FleetCounts:
    """The fleet at one instant, by provider: what the gauges show."""

    phases: dict[tuple[str, str], int] = field(default_factory=dict)
    """(provider, phase) -> proxies; every phase of every provider seen, zeros included."""
    by_provider: dict[str, dict[str, int]] = field(default_factory=dict)
    """provider -> gauge name (``PROXY_GAUGES``) -> proxies."""


_SLOTS = {name: n for n, name in enumerate([*PROXY_GAUGES, *Phase])}
"""Where each gauge and phase is counted in a provider's tally (a list, for speed)."""
UNHEALTHY, LEASED, COOLING, BACKOFF, HEALTHY, AVAILABLE = (
    _SLOTS[name]
    for name in ("unhealthy", "leased", "cooling_down", "backoff", "healthy", "available")
)


@dataclass
class EgressCounts:
    """What the fleet's egress findings say, by provider."""

    by_provider: dict[str, dict[str, int]] = field(default_factory=dict)
    """provider -> gauge name (``EGRESS_GAUGES``) -> proxies; every provider seen, zeros too."""
    countries: dict[tuple[str, str], int] = field(default_factory=dict)
    """(country seen, provider) -> proxies; ``unknown`` for no country seen."""
    held_back: set[str] = field(default_factory=set)
    """Uids no lease request gets for their egress (mismatch, unchecked, shared under
    ``--unique-egress``): not ``available``."""


def count_egress(
    proxies: Iterable[ProxyView], policy: EgressPolicy, index: EgressIndex
) -> EgressCounts:
    """Judge each existing proxy's egress as discovery does (``projections.egress.blocked``,
    ``index`` for who shares an address). Pure; country labels are bounded by ISO 3166."""
    counts = EgressCounts()
    countries: Counter[tuple[str, str]] = Counter()
    for proxy in proxies:
        if proxy.removed:
            continue
        provider = proxy.spec.provider
        tally = counts.by_provider.get(provider)
        if tally is None:
            tally = counts.by_provider[provider] = dict.fromkeys(EGRESS_GAUGES, 0)
        found = egress.finding(proxy)
        seen = found.country if found is not None and found.ip else ""
        countries[seen or UNKNOWN_COUNTRY, provider] += 1
        reason = egress.blocked(proxy, policy, index.later(proxy.uid))[0]
        if reason:
            counts.held_back.add(proxy.uid)
        if reason == MISMATCH:
            tally["egress_mismatch"] += 1
        if index.sharing(proxy.uid):
            tally["egress_shared"] += 1
    counts.countries = dict(sorted(countries.items()))
    return counts


def count_fleet(
    proxies: Iterable[ProxyView],
    leases: Mapping[str, LeaseView],
    now: datetime,
    held_back: Container[str] = frozenset(),
) -> FleetCounts:
    """Count the proxies that exist (declared and not removed); ``held_back``: those no lease
    request gets for their egress (``count_egress``), not available. Pure, and written for
    speed: a scrape runs it on the event loop, over every proxy (10,000 in about 10 ms)."""
    tallies: dict[str, list[int]] = {}
    for proxy in proxies:
        if proxy.removed:
            continue
        provider = proxy.spec.provider
        tally = tallies.get(provider)
        if tally is None:
            tally = tallies[provider] = [0] * len(_SLOTS)
        tally[_SLOTS[proxy.phase]] += 1
        if proxy.healthy is False:
            tally[UNHEALTHY] += 1
        lease = leases.get(proxy.uid)
        free = True
        if lease is not None:
            current = lease.current
            if current is not None and now < current.expires_at:
                free = False
                tally[LEASED] += 1
            elif (current is not None or lease.cooldown_until is not None) and (
                (when := available_at(lease)) is not None and when > now
            ):
                free = False
                tally[COOLING] += 1
            backoffs = lease.reports.backoffs
            if backoffs and any(b.until > now for b in backoffs.values()):
                tally[BACKOFF] += 1
        if leasable(proxy):
            tally[HEALTHY] += 1
            if free and proxy.uid not in held_back:
                tally[AVAILABLE] += 1
    counts = FleetCounts()
    for provider, tally in sorted(tallies.items()):
        counts.by_provider[provider] = {name: tally[_SLOTS[name]] for name in PROXY_GAUGES}
        for phase in Phase:
            counts.phases[provider, phase.value] = tally[_SLOTS[phase]]
    return counts
