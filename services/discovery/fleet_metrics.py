"""Fleet gauges for Prometheus, computed from discovery's views when ``/metrics`` is scraped.

Nothing here is updated per event: the views already hold every proxy and lease, so a scrape
counts them (10,000 proxies in about 10 ms) and the event path pays nothing for the metrics
(docs/architecture.md, "Telemetry"; docs/decisions/0086-fleet-metrics-are-counted-from.md). Labels
are bounded: phase, provider (the providers configured), consumer (the services with a consumer
loop), the country an egress was seen in (ISO 3166); never a proxy.

What the views do not hold, the log's own state (dead letters kept, and how far each durable
consumer is behind), is read from JetStream by a small poller every ``LOG_INTERVAL`` seconds and
shown with its age, so a scrape never waits on NATS.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import Counter
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import structlog
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from events import subjects
from events.schemas import Phase
from projections import egress
from projections.egress import MISMATCH, EgressIndex, EgressPolicy
from projections.lease import LeaseView
from projections.lease_queries import available_at, leasable
from projections.proxy import ProxyView
from services.discovery.views import Views
from services.runtime.aio import raise_if_cancelled
from services.runtime.metrics import metric_set
from services.runtime.natsusers import CONSUMERS

log = structlog.get_logger("egress.discovery")

LOG_INTERVAL = 10.0
"""Seconds between two reads of the log's state (stream and consumer info)."""
LOG_TIMEOUT = 5.0

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

CONSUMER_GAUGES: Mapping[str, str] = {
    "pending": "Messages of the stream the durable consumer has not delivered yet (the log's "
    "view of its lag, whichever replica is alive)",
    "ack_pending": "Messages delivered to the durable consumer and not acknowledged yet",
    "redelivered": "Messages delivered to the durable consumer more than once and not yet "
    "acknowledged",
}
"""``egress_consumer_<name>_messages{consumer}``, from JetStream's consumer info."""


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


@dataclass
class LogState:
    """The log's own state at ``read_at`` (monotonic seconds; 0: never read)."""

    dead_letters: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, dict[str, int]] = field(default_factory=dict)
    read_at: float = 0.0


class FleetSource:
    """What one discovery replica shows: its views, and the log state its poller reads."""

    def __init__(self, views: Views, js: JetStreamContext) -> None:
        self.views = views
        self.js = js
        self.log = LogState()

    @classmethod
    def watch(cls, registry: CollectorRegistry, views: Views, js: JetStreamContext) -> FleetSource:
        """The source the registry's fleet collector shows from now on (the collector is made
        once per registry; a service started again in the same process brings new views)."""
        source = cls(views, js)
        metric_set(registry, FleetCollector).source = weakref.ref(source)
        return source

    async def run(self, interval: float = LOG_INTERVAL) -> None:
        while True:
            raise_if_cancelled()  # nats-py can swallow a cancellation inside a request
            await self.read_log()
            await asyncio.sleep(interval)

    async def read_log(self) -> None:
        """Read dead letters and consumer info; on a failure keep the last values (their age
        grows, ``egress_log_state_age_seconds``) rather than show zeros that were never read."""
        try:
            async with asyncio.timeout(LOG_TIMEOUT):
                info = await self.js.stream_info(
                    subjects.DEADLETTER_STREAM, subjects_filter="deadletter.>"
                )
                dead = dict.fromkeys(CONSUMERS, 0)
                for subject, count in (info.state.subjects or {}).items():
                    dead[subject.removeprefix("deadletter.")] = count
                consumers: dict[str, dict[str, int]] = {}
                for durable, stream in CONSUMERS.items():
                    try:
                        ci = await self.js.consumer_info(stream, durable)
                    except NotFoundError:
                        continue  # not created yet: its service has not started
                    consumers[durable] = {
                        "pending": ci.num_pending or 0,
                        "ack_pending": ci.num_ack_pending or 0,
                        "redelivered": ci.num_redelivered or 0,
                    }
        except (NatsError, TimeoutError) as exc:
            log.warning("cannot read the log's state for metrics", error=str(exc) or "timeout")
            return
        self.log = LogState(dead, consumers, time.monotonic())


class FleetCollector(Collector):
    """Registered once per registry (``metric_set``); shows the newest ``FleetSource``, held
    weakly, so a stopped service's views are neither kept alive nor shown."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.source: weakref.ref[FleetSource] | None = None
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        return iter(self._families().values())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        source = self.source() if self.source is not None else None
        if source is not None:
            self._fill(families, source)
        return iter(families.values())

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        families = {
            "phase": GaugeMetricFamily(
                "egress_proxies",
                "Proxies that exist (declared, not removed) by phase and provider",
                labels=["phase", "provider"],
            )
        }
        for name, text in {**PROXY_GAUGES, **EGRESS_GAUGES}.items():
            families[name] = GaugeMetricFamily(f"egress_proxies_{name}", text, labels=["provider"])
        families["egress_country"] = GaugeMetricFamily(
            "egress_proxies_egress_proxies",
            "Proxies that exist by the country their egress was seen in (unknown: not checked, "
            "failed, or a private address) and provider",
            labels=["country", "provider"],
        )
        families["dead_letters"] = GaugeMetricFamily(
            "egress_dead_letters",
            "Messages kept in the DEADLETTER stream, by the consumer that gave up on them",
            labels=["consumer"],
        )
        for name, text in CONSUMER_GAUGES.items():
            families[name] = GaugeMetricFamily(
                f"egress_consumer_{name}_messages", text, labels=["consumer"]
            )
        families["log_age"] = GaugeMetricFamily(
            "egress_log_state_age_seconds",
            "Seconds since the dead letters and consumer gauges were last read from JetStream",
        )
        return families

    @staticmethod
    def _fill(families: dict[str, GaugeMetricFamily], source: FleetSource) -> None:
        views = source.views
        proxies = views.proxies.views.values()
        candidates = views.candidates
        judged = count_egress(proxies, candidates.policy, candidates.egress)
        counts = count_fleet(proxies, views.leases.views, views.now(), judged.held_back)
        for (provider, phase), n in sorted(counts.phases.items()):
            families["phase"].add_metric([phase, provider], n)
        for provider, gauges in sorted(counts.by_provider.items()):
            for name, n in {**gauges, **judged.by_provider.get(provider, {})}.items():
                families[name].add_metric([provider], n)
        for (country, provider), n in judged.countries.items():
            families["egress_country"].add_metric([country, provider], n)
        state = source.log
        if not state.read_at:
            return
        for consumer, n in sorted(state.dead_letters.items()):
            families["dead_letters"].add_metric([consumer], n)
        for consumer, values in sorted(state.consumers.items()):
            for name, n in values.items():
                families[name].add_metric([consumer], n)
        families["log_age"].add_metric([], time.monotonic() - state.read_at)
