"""Prometheus metrics every service exposes on ``/metrics``.

One registry per process: ``up`` runs every service in one process and they share it, so each
metric carries the consumer or service as a label rather than being registered per service.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from events.skips import SkipLedger
from services.runtime.eventlog.skipped import LEDGER
from services.runtime.settings.errors import ConfigError

if TYPE_CHECKING:
    from services.runtime.nats.connection import Connection


class SkippedEvents(Collector):
    """``egress_events_skipped_total`` from the process's skip ledger, read at scrape time: the
    readers that skip live below this layer and count without knowing about Prometheus."""

    def __init__(self, ledger: SkipLedger = LEDGER) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "egress_events_skipped",
            "Stored events a reader skipped because no fold could use them, each counted once "
            "per process (reason: undecodable, unknown_type, unusable)",
            labels=["stream", "type", "reason"],
        )
        for (stream, event_type, reason), count in sorted(self.ledger.counts.items()):
            family.add_metric([stream, event_type, reason], count)
        yield family


class NatsConnections(Collector):
    """``egress_nats_connected`` and ``egress_nats_reconnects_total`` for each service's NATS
    connection, read at scrape time. Held weakly: a service gone with its connection drops out
    instead of showing as disconnected for the rest of the process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connections: weakref.WeakValueDictionary[str, Connection] = (
            weakref.WeakValueDictionary()
        )
        registry.register(self)

    def watch(self, service: str, conn: Connection) -> None:
        self.connections[service] = conn

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        connected, reconnects = self._families()
        for service, conn in sorted(self.connections.items()):
            connected.add_metric([service], 1.0 if conn.nc.is_connected else 0.0)
            reconnects.add_metric([service], conn.reconnects)
        yield from (connected, reconnects)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, CounterMetricFamily]:
        return (
            GaugeMetricFamily(
                "egress_nats_connected",
                "1 while the service's connection to NATS is up, else 0 (it reconnects for ever)",
                labels=["service"],
            ),
            CounterMetricFamily(
                "egress_nats_reconnects",
                "Times the service's NATS connection came back after it was lost",
                labels=["service"],
            ),
        )


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.consumer_lag = Gauge(
            "egress_consumer_lag_messages",
            "Messages in the stream not yet delivered to the durable consumer",
            ["consumer"],
            registry=r,
        )
        self.consumer_inflight = Gauge(
            "egress_consumer_inflight_messages",
            "Messages fetched and not yet acknowledged by this replica",
            ["consumer"],
            registry=r,
        )
        self.messages = Counter(
            "egress_consumer_messages_total",
            "Messages handled, by outcome (ack, retry, failed, deadletter, skipped)",
            ["consumer", "result"],
            registry=r,
        )
        self.handle_seconds = Histogram(
            "egress_consumer_handle_seconds",
            "Time a handler took per message",
            ["consumer"],
            registry=r,
        )
        self.consumer_drift = Counter(
            "egress_consumer_drift_total",
            "Times a replica found its durable consumer changed behind its back or gone, by what "
            "differed (vanished, filter, deliver_policy, start, ack_policy); each was restored "
            "from its last known ack floor",
            ["consumer", "kind"],
            registry=r,
        )
        self.appends = Counter(
            "egress_event_appends_total",
            "Event appends, by outcome (ok, conflict, duplicate)",
            ["result"],
            registry=r,
        )

        self.provider_requests = Counter(
            "egress_provider_requests_total",
            "Provider calls by provider instance, operation and result (ok or the error class)",
            ["provider", "op", "result"],
            registry=r,
        )
        self.provider_seconds = Histogram(
            "egress_provider_request_seconds",
            "Provider call latency",
            ["provider", "op"],
            registry=r,
        )
        self.reconcile = Counter(
            "egress_reconcile_total",
            "Reconcile decisions by outcome (created, replaced, deleted, ready, failed, noop, ...)",
            ["outcome"],
            registry=r,
        )
        r.register(SkippedEvents())

    def render(self) -> bytes:
        return generate_latest(self.registry)


M = TypeVar("M")

_sets: weakref.WeakKeyDictionary[CollectorRegistry, dict[Callable[..., Any], Any]] = (
    weakref.WeakKeyDictionary()
)


def metric_set(registry: CollectorRegistry, factory: Callable[[CollectorRegistry], M]) -> M:
    """The metrics ``factory`` registers on ``registry``, registered once however often they
    are asked for: a process that builds a service twice (tests, a restart of the service inside
    ``up``) reuses the collectors, where registering them again would fail on duplicates.
    ``factory`` is the key next to the registry, so it must be one object (a class or a module
    function, not a fresh lambda); a registry dropped by its owner drops its sets too."""
    sets = _sets.setdefault(registry, {})
    if factory not in sets:
        sets[factory] = factory(registry)
    return cast(M, sets[factory])


_default: Metrics | None = None


def default_metrics() -> Metrics:
    global _default  # noqa: PLW0603 - one registry per process, created on first use
    if _default is None:
        _default = Metrics()
    return _default


class MetricsServer:
    """A tiny HTTP server for ``/metrics`` on the event loop (no thread, no framework)."""

    def __init__(self, metrics: Metrics, host: str, port: int) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)
        except OSError as exc:
            raise ConfigError(
                f"--metrics-port / METRICS_PORT: cannot listen on {self.host}:{self.port} "
                f"({exc.strerror or exc}); choose a free port, or 0 to turn /metrics off"
            ) from exc
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5.0)
            while (await asyncio.wait_for(reader.readline(), 5.0)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request.decode("latin-1").split()
            path = parts[1] if len(parts) > 1 else ""
            if path.split("?")[0] == "/metrics":
                body, status, ctype = self.metrics.render(), "200 OK", CONTENT_TYPE_LATEST
            elif path == "/healthz":
                body, status, ctype = b"ok\n", "200 OK", "text/plain"
            else:
                body, status, ctype = b"not found\n", "404 Not Found", "text/plain"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
