"""A service's metrics are registered once per registry, however often the service is built."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from services.discovery.observability.metrics import DiscoveryMetrics, discovery_metrics
from services.gc.collector import gc_metrics
from services.health.metrics import health_metrics
from services.runtime.observability.metrics import metric_set
from services.watcher.metrics import watcher_metrics


def counter(registry: CollectorRegistry) -> Counter:
    return Counter("egress_test_things_total", "Things", registry=registry)


def test_one_set_per_registry_and_factory() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    assert metric_set(first, counter) is metric_set(first, counter)
    assert metric_set(second, counter) is not metric_set(first, counter)
    assert metric_set(first, DiscoveryMetrics) is discovery_metrics(first)


def test_every_service_set_can_share_one_registry() -> None:
    registry = CollectorRegistry()
    for build in (discovery_metrics, gc_metrics, health_metrics, watcher_metrics):
        assert build(registry) is build(registry)
