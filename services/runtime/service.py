"""How a service is started: one or many in a process, sharing connection, store and metrics.

``egress-proxies up`` runs every service in one process; ``egress-proxies run NAME`` runs one, for
deployments that scale each service separately. Both go through ``run_services``, so a service
behaves the same either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from events.jetstream import JetStreamEventStore
from events.streams import ensure_streams
from services.runtime.config import Settings
from services.runtime.connection import Connection, connect
from services.runtime.metrics import Metrics, MetricsServer, default_metrics
from services.runtime.telemetry import configure_tracing, shutdown_tracing

log = structlog.get_logger("egress.service")


@dataclass
class ServiceContext:
    settings: Settings
    conn: Connection
    store: JetStreamEventStore
    metrics: Metrics


class Service(Protocol):
    name: str

    async def run(self, ctx: ServiceContext) -> None:
        """Run until cancelled. Raising ends the whole process: a service that cannot work
        should fail loudly rather than sit in a process that looks healthy."""
        ...


@dataclass(frozen=True, slots=True)
class Started:
    """What the process listens on, for the start-up banner."""

    nats_url: str
    metrics_url: str
    services: tuple[str, ...]


async def run_services(
    services: Sequence[Service],
    settings: Settings,
    *,
    on_started: Callable[[Started], Awaitable[None] | None] | None = None,
) -> None:
    configure_tracing(settings.service_name)
    metrics = default_metrics()
    conn = await connect(settings.nats_url, name=settings.service_name)
    server: MetricsServer | None = None
    try:
        created = await ensure_streams(conn.js, settings.stream_replicas)
        if created:
            log.info("streams created", streams=created)
        store = JetStreamEventStore(conn.nc, conn.js)
        ctx = ServiceContext(settings=settings, conn=conn, store=store, metrics=metrics)
        metrics_url = ""
        if settings.metrics_port:
            server = MetricsServer(metrics, settings.metrics_host, settings.metrics_port)
            await server.start()
            metrics_url = f"http://{settings.metrics_host}:{server.port}/metrics"
        if on_started is not None:
            result = on_started(
                Started(settings.nats_url, metrics_url, tuple(s.name for s in services))
            )
            if result is not None:
                await result
        async with asyncio.TaskGroup() as group:
            for service in services:
                group.create_task(_supervised(service.run(ctx)), name=service.name)
            if not services:
                group.create_task(asyncio.Event().wait(), name="idle")
    finally:
        if server is not None:
            await server.close()
        await conn.close()
        shutdown_tracing()


async def _supervised(work: Coroutine[Any, Any, None]) -> None:
    """Run a service so that a stop always stops it.

    nats-py can swallow a ``CancelledError`` that lands inside one of its calls, and a service
    loop then carries on as if nothing happened, so ``up`` would hang on Ctrl-C. The service
    runs as its own task; when we are cancelled we keep cancelling it until it has ended.
    """
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.5)
        raise
