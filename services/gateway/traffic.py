"""The gateway's traffic records: counted as exchanges end, appended every ``--traffic-interval``
to ``traffic.<client>`` (docs/decisions/0158-traffic-records.md).

A flush that cannot append keeps its records for the next one, under the same message ids, so a
record the stream stored before the failure was noticed is not stored twice. What was counted
since the last flush is lost when the process is killed (a graceful stop flushes once more).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from events import subjects
from events.codec import InvalidEvent
from events.errors import EventStoreError
from events.store import EventStore
from services.gateway.pure.traffic import Backlog, Counts, Exchange
from services.runtime.observability.metrics import metric_set

log = structlog.get_logger("egress.gateway")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def default_replica() -> str:
    """This process, for the records' ``replica`` and message ids: unique per start, so that a
    restarted replica's records are never taken for repeats of its predecessor's."""
    raw = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return _UNSAFE.sub("-", raw)[:128]


class TrafficMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.records = Counter(
            "egress_gateway_traffic_records_total",
            "Traffic records appended to the TRAFFIC stream (one per client, proxy and lease "
            "per interval)",
            registry=r,
        )
        self.failures = Counter(
            "egress_gateway_traffic_flush_failures_total",
            "Flushes that could not append every record (the rest wait for the next flush)",
            registry=r,
        )
        self.dropped = Counter(
            "egress_gateway_traffic_dropped_total",
            "What the traffic records lost, by reason: bounds (exchanges beyond an interval's "
            "bounds), backlog (records that waited too long or too many), invalid (a record the "
            "codec refused)",
            ["reason"],
            registry=r,
        )
        self.pending = Gauge(
            "egress_gateway_traffic_pending",
            "Traffic records waiting for the log to take them",
            registry=r,
        )


def traffic_metrics(registry: CollectorRegistry) -> TrafficMetrics:
    return metric_set(registry, TrafficMetrics)


class TrafficRecorder:
    def __init__(
        self,
        store: EventStore,
        metrics: TrafficMetrics,
        *,
        interval: float,
        replica: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.interval = interval
        self.replica = replica or default_replica()
        self.clock = clock
        self.counts = Counts()
        self.backlog = Backlog()
        self.started = clock()

    def count(self, exchange: Exchange) -> None:
        self.counts.add(exchange)

    async def flush(self) -> int:
        """Close the interval and append its records and any a failed flush left; the number
        appended."""
        now = self.clock()
        start = datetime.fromtimestamp(self.started, UTC)
        length = min(max(now - self.started, 0.001), 3600.0)
        self.started = now
        if self.counts.dropped:
            self.metrics.dropped.labels("bounds").inc(self.counts.dropped)
        made = self.counts.take(replica=self.replica, start=start, interval=length)
        self.backlog.add(made, now)
        appended = 0
        try:
            for subject_key, waiting in self.backlog.due(now).items():
                aggregate = subjects.traffic(subject_key)
                for new in waiting:
                    try:
                        await self.store.append(aggregate, [new])
                    except InvalidEvent as exc:
                        log.error("traffic record refused", error=str(exc))
                        self.metrics.dropped.labels("invalid").inc()
                    else:
                        appended += 1
                    self.backlog.done([new.msg_id])
        except EventStoreError as exc:
            self.metrics.failures.inc()
            log.warning(
                "traffic records not appended yet", waiting=len(self.backlog), error=str(exc)
            )
        finally:
            dropped = self.backlog.take_dropped()
            if dropped:
                self.metrics.dropped.labels("backlog").inc(dropped)
            self.metrics.records.inc(appended)
            self.metrics.pending.set(len(self.backlog))
        return appended

    async def run(self) -> None:
        """Flush every interval; when cancelled (a graceful stop), once more."""
        try:
            while True:
                await asyncio.sleep(self.interval)
                await self.flush()
        except asyncio.CancelledError:
            if not self.counts.empty() or len(self.backlog):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.flush(), timeout=5.0)
            raise
