"""The health prober's Prometheus metrics: every probe lands here, not in the log or the event log.

Fleet-level series only (no proxy label): a label per proxy would make thousands of series per
replica for figures an operator reads as a distribution. Which proxy is unhealthy is in the event
log and the proxy views; these say how the probing goes.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.runtime.observability.metrics import metric_set

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class HealthMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.probes = Counter(
            "egress_health_probes_total",
            "Health probes by result (ok, timeout, connect_error, bad_status, ...)",
            ["result"],
            registry=registry,
        )
        self.latency = Histogram(
            "egress_health_probe_latency_seconds",
            "Latency of successful health probes through the proxy",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.events = Counter(
            "egress_health_events_total",
            "HealthChanged appends by outcome (healthy, unhealthy, latency, conflict, error)",
            ["outcome"],
            registry=registry,
        )
        self.rechecks = Counter(
            "egress_health_rechecks_total",
            "Probes called for at once by holders' failed reports (--failed-reports-recheck), by "
            "result: woken (a probe started at once), in_flight (the probe already under way "
            "counts)",
            ["result"],
            registry=registry,
        )
        self.owned = Gauge(
            "egress_health_owned_proxies",
            "Proxies this replica probes",
            registry=registry,
        )
        self.members = Gauge(
            "egress_health_members",
            "Live health replicas this replica sees",
            registry=registry,
        )
        self.last_probe_age = Gauge(
            "egress_health_last_probe_age_seconds",
            "Age of the oldest last probe among the proxies this replica probes "
            "(grows when probing falls behind)",
            registry=registry,
        )

        self.egress_checks = Counter(
            "egress_health_egress_checks_total",
            "Echo URL fetches through proxies (--egress-interval) by result: ok (an address "
            "was found), error (the fetch or the answer failed; the finding says why)",
            ["result"],
            registry=registry,
        )
        self.egress_events = Counter(
            "egress_health_egress_events_total",
            "Egress findings appended by kind: observed (new), changed (another address than "
            "the one recorded), error (not recorded)",
            ["outcome"],
            registry=registry,
        )
        self.egress_replacements = Counter(
            "egress_health_egress_replacements_total",
            "Rotations asked for because a proxy's egress did not match its expectation "
            "(spec.egress.onMismatch: replace), by result (requested, rotating, absent, "
            "contended)",
            ["result"],
            registry=registry,
        )

    def watch_age(self, oldest_age: Callable[[], float]) -> None:
        self.last_probe_age.set_function(oldest_age)


def health_metrics(registry: CollectorRegistry) -> HealthMetrics:
    """One set per registry: a process registers the series once, however often it starts."""
    return metric_set(registry, HealthMetrics)
