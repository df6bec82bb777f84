"""The watcher's Prometheus metrics, on the process's one registry (``ServiceContext.metrics``).

What an operator asks of a controller: is this replica the leader, how often does it have to
list everything again (a watch that keeps expiring is a sign of an overloaded apiserver), what
does it declare, and do its status patches go through.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from services.runtime.observability.metrics import metric_set


class WatcherMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = r = registry
        self.leader = Gauge(
            "egress_watcher_leader", "1 while this replica leads and works, else 0", registry=r
        )
        self.relists = Counter(
            "egress_watcher_relists_total",
            "Full listings of the Proxy objects (start of a term, 410 Gone, resync, errors)",
            registry=r,
        )
        self.declarations = Counter(
            "egress_watcher_declarations_total",
            "Proxy objects brought into the log, by result (created, changed, unchanged, ...)",
            ["result"],
            registry=r,
        )
        self.status_patches = Counter(
            "egress_watcher_status_patches_total",
            "Status patches by result (ok, gone: the object was deleted, failed)",
            ["result"],
            registry=r,
        )
        self.kube_events = Counter(
            "egress_watcher_kube_events_total",
            "Kubernetes Events recorded for phase and condition transitions",
            registry=r,
        )


def watcher_metrics(registry: CollectorRegistry) -> WatcherMetrics:
    """One set per registry: a process that runs several terms reuses the collectors."""
    return metric_set(registry, WatcherMetrics)
