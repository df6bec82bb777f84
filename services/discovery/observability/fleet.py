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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import structlog
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from events import subjects
from services.discovery.pure.fleet import EGRESS_GAUGES, PROXY_GAUGES, count_egress, count_fleet
from services.discovery.views import Views
from services.runtime.aio import raise_if_cancelled
from services.runtime.nats.users import CONSUMERS
from services.runtime.observability.metrics import metric_set

log = structlog.get_logger("egress.discovery")

LOG_INTERVAL = 10.0
"""Seconds between two reads of the log's state (stream and consumer info)."""
LOG_TIMEOUT = 5.0

CONSUMER_GAUGES: Mapping[str, str] = {
    "pending": "Messages of the stream the durable consumer has not delivered yet (the log's "
    "view of its lag, whichever replica is alive)",
    "ack_pending": "Messages delivered to the durable consumer and not acknowledged yet",
    "redelivered": "Messages delivered to the durable consumer more than once and not yet "
    "acknowledged",
}
"""``egress_consumer_<name>_messages{consumer}``, from JetStream's consumer info."""


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
