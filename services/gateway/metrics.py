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
        self._children: dict[tuple[str, str, str], tuple[Counter, Counter, Counter]] = {}
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

    def exchange(self, client: str, kind: str, outcome: str, up: int, down: int) -> None:
        """One request or tunnel relayed; the labelled children are kept, since looking them
        up is a good part of a small request's cost."""
        key = (client, kind, outcome)
        children = self._children.get(key)
        if children is None:
            children = (
                self.requests.labels(client, kind, outcome),
                self.bytes.labels(client, "up"),
                self.bytes.labels(client, "down"),
            )
            self._children[key] = children
        children[0].inc()
        if up:  # a GET sends no body: an increment by nothing costs as much as one by much
            children[1].inc(up)
        if down:
            children[2].inc(down)


def gateway_metrics(registry: CollectorRegistry) -> GatewayMetrics:
    return metric_set(registry, GatewayMetrics)
