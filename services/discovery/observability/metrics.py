"""Discovery's Prometheus metrics, on the process's one registry (``ServiceContext.metrics``).

Registered once per registry: a process that builds the app twice (tests, a restart of the
service inside one process) reuses the same collectors instead of failing on duplicates.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.runtime.observability.metrics import metric_set


class DiscoveryMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.acquisitions = Counter(
            "egress_lease_acquisitions_total",
            "Lease requests by result (acquired; replayed: an Idempotency-Key answered with its "
            "lease; busy: proxies match but none can be leased now; no_match: no proxy has the "
            "selector's attributes)",
            ["result"],
            registry=r,
        )
        self.pool_busy = Counter(
            "egress_lease_pool_busy_total",
            "Lease requests naming a pool answered 503 (also counted busy above), by whether the "
            "pool was scaling (true: fewer members than desired, or some not Ready yet)",
            ["scaling"],
            registry=r,
        )
        self.conflicts = Counter(
            "egress_lease_conflicts_total",
            "Lease claims (and renewals: reason renewal) that lost an optimistic-concurrency race "
            "or were refused by the fold",
            ["reason"],
            registry=r,
        )
        self.acquire_seconds = Histogram(
            "egress_lease_acquire_seconds",
            "Time to answer a lease request, including the wait for the view",
            registry=r,
        )
        self.wait_seconds = Histogram(
            "egress_lease_wait_seconds",
            "How long lease requests with waitSeconds waited in this replica's queue, by result "
            "(acquired; timeout: answered 503 when the wait was over)",
            ["result"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60),
            registry=r,
        )
        self.waiting = Gauge(
            "egress_lease_requests_waiting",
            "Lease requests waiting in this replica's queue for a proxy to become free",
            registry=r,
        )
        self.releases = Counter(
            "egress_lease_releases_total",
            "Release requests by result (released; unknown: unknown, or no longer active)",
            ["result"],
            registry=r,
        )
        self.reports = Counter(
            "egress_lease_reports_total",
            "Outcome reports by outcome (success, blocked, failed)",
            ["outcome"],
            registry=r,
        )
        self.expirations = Counter(
            "egress_lease_expirations_recorded_total",
            "LeaseExpired events this replica appended for leases past their end",
            registry=r,
        )
        self.active = Gauge(
            "egress_leases_active",
            "Leases this replica's view holds as active",
            registry=r,
        )
        self.requests = Counter(
            "egress_http_requests_total",
            "Discovery API requests by method, route template and status",
            ["method", "route", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "egress_http_request_seconds",
            "Discovery API request latency by method and route template",
            ["method", "route"],
            registry=r,
        )


def discovery_metrics(registry: CollectorRegistry) -> DiscoveryMetrics:
    return metric_set(registry, DiscoveryMetrics)
