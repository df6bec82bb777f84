"""Lease requests by selector size: how often a request is answered 503, and how long one that
may wait (``waitSeconds``) waits, by how many attribute pairs it asks for.

A narrow selector (many pairs) matches few proxies, so it is the first to hear 503 when the
fleet is short of one kind: an operator sees which kind to add. The label is the number of
pairs, capped (``selector_keys`` "0" .. "4", then "5+"), never the pairs themselves, so the
series stay few whatever the crawlers send (docs/decisions/0086-fleet-metrics-are-counted-from.md).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram

from events.errors import EventStoreError
from events.store import EventStore
from services.discovery.http.errors import ApiError
from services.discovery.leasing.leases import LeaseRequest, Leases
from services.discovery.observability.metrics import DiscoveryMetrics
from services.discovery.pure.errorcodes import ErrorCode
from services.discovery.pure.policy import Granted, LeasePolicy
from services.discovery.views import Views
from services.runtime.observability.metrics import metric_set

MAX_KEYS = 5
RESULTS = {
    ErrorCode.NO_PROXY_AVAILABLE: "busy",
    ErrorCode.NO_MATCHING_PROXY: "no_match",
    ErrorCode.UNAVAILABLE: "unavailable",
}
"""API error code -> result label; any other refusal is ``refused``."""


def selector_keys(selector: Mapping[str, str]) -> str:
    """The bounded label for a selector's size."""
    n = len(selector)
    return f"{MAX_KEYS}+" if n >= MAX_KEYS else str(n)


class SelectorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "egress_lease_requests_by_selector_total",
            "Lease requests by the number of selector pairs and result (acquired; busy: "
            "answered 503 no_proxy_available; no_match; unavailable: the log was unreachable; "
            "refused: any other error)",
            ["selector_keys", "result"],
            registry=registry,
        )
        self.waits = Histogram(
            "egress_lease_request_wait_seconds",
            "Time to answer lease requests that may wait (waitSeconds > 0), by the number of "
            "selector pairs and result",
            ["selector_keys", "result"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60),
            registry=registry,
        )


def selector_metrics(registry: CollectorRegistry) -> SelectorMetrics:
    return metric_set(registry, SelectorMetrics)


class MeasuredLeases(Leases):
    """``Leases`` whose requests are also counted by selector size: measured around ``serve``,
    the whole request, so the leasing code stays as it is."""

    def __init__(
        self,
        store: EventStore,
        views: Views,
        policy: LeasePolicy,
        metrics: DiscoveryMetrics,
        registry: CollectorRegistry,
    ) -> None:
        super().__init__(store, views, policy, metrics)
        self.by_selector = selector_metrics(registry)

    async def serve(self, request: LeaseRequest) -> Granted:
        started = time.monotonic()
        result = "refused"
        try:
            granted = await super().serve(request)
            result = "acquired"
            return granted
        except ApiError as exc:
            result = RESULTS.get(exc.code, "refused")
            raise
        except EventStoreError:
            result = "unavailable"
            raise
        finally:
            keys = selector_keys(request.selector)
            self.by_selector.requests.labels(keys, result).inc()
            if request.wait > 0:
                waited = time.monotonic() - started
                self.by_selector.waits.labels(keys, result).observe(waited)
