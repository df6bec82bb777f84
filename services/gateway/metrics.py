"""The gateway's Prometheus metrics (docs/operations.md, "Metrics").

Labelled by client, never by target host or lease: a crawl touches millions of hosts, and a
series per host would be the monitoring's outage. What a target or a lease saw is in the log's
traffic records instead (docs/gateway.md, "Traffic").
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from services.runtime.observability.metrics import metric_set


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter(
            "egress_gateway_requests_total",
            "Requests and tunnels relayed, by client, kind (http, tunnel) and outcome (success, "
            "blocked, failed); a retried request counts each attempt",
            ["client", "kind", "outcome"],
            registry=r,
        )
        self.bytes = Counter(
            "egress_gateway_bytes_total",
            "Bytes relayed, by client and direction (up: to the site, down: to the crawler)",
            ["client", "direction"],
            registry=r,
        )
        self.refusals = Counter(
            "egress_gateway_refusals_total",
            "Requests the gateway answered itself, by reason (unauthorized, user_name, scope, "
            "throttled, head, target, body, connections, upstreams, no_lease)",
            ["reason"],
            registry=r,
        )
        self.file_errors = Counter(
            "egress_gateway_clients_file_errors_total",
            "Re-reads of the clients file that failed (the table in use stays as it was)",
            registry=r,
        )
        self.connections = Gauge(
            "egress_gateway_connections", "Crawler connections open on this replica", registry=r
        )
        self.leases = Gauge(
            "egress_gateway_leases",
            "Leases this replica holds for its crawlers, by kind (session, rotating)",
            ["kind"],
            registry=r,
        )


def gateway_metrics(registry: CollectorRegistry) -> GatewayMetrics:
    return metric_set(registry, GatewayMetrics)
