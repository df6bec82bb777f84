"""How a service is started: one or many in a process, sharing metrics and tracing.

``egress-proxies up`` runs every service in one process; ``egress-proxies run NAME`` runs one, for
deployments that scale each service separately. Both go through ``run_services``, so a service
behaves the same either way. Each service has a NATS connection (and event store) of its own, so
that it logs in as its own user and holds only that user's permissions, in ``up`` too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import nats.errors
import structlog

from events.errors import StoreUnavailable
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import Connection, connect
from services.runtime.observability.metrics import (
    Metrics,
    MetricsServer,
    NatsConnections,
    default_metrics,
    metric_set,
)
from services.runtime.observability.telemetry import configure_tracing, shutdown_tracing
from services.runtime.settings.shared import Credentials, Settings, redact_url

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
    """Without its password: it is printed and logged."""
    metrics_url: str
    services: tuple[str, ...]


async def run_services(
    services: Sequence[Service],
    settings: Settings,
    *,
    on_started: Callable[[Started], Awaitable[None] | None] | None = None,
    credentials: Mapping[str, Credentials] | None = None,
) -> None:
    """``credentials`` maps service names to their NATS users (``up``'s embedded server); a
    service not in it logs in with ``settings.credentials``, the URL's user, or its local user
    (``services.runtime.nats.connection.credentials_for``)."""
    configure_tracing(settings.service_name)
    metrics = default_metrics()
    given = credentials or {}
    conns: list[Connection] = []
    server: MetricsServer | None = None
    try:
        for service in services:
            conns.append(
                await connect(
                    settings.nats_url,
                    name=f"egress-proxies-{service.name}",
                    credentials=given.get(service.name, settings.credentials),
                    user=service.name,
                )
            )
            metric_set(metrics.registry, NatsConnections).watch(service.name, conns[-1])
        if not conns:
            conns.append(
                await connect(
                    settings.nats_url, name=settings.service_name, credentials=settings.credentials
                )
            )
        created = await ensure_streams(conns[0].js, settings.stream_replicas)
        if created:
            log.info("streams created", streams=created)
        metrics_url = ""
        if settings.metrics_port:
            server = MetricsServer(metrics, settings.metrics_host, settings.metrics_port)
            await server.start()
            metrics_url = f"http://{settings.metrics_host}:{server.port}/metrics"
        if on_started is not None:
            names = tuple(s.name for s in services)
            result = on_started(Started(redact_url(settings.nats_url), metrics_url, names))
            if result is not None:
                await result
        async with asyncio.TaskGroup() as group:
            for service, conn in zip(services, conns, strict=False):
                store = JetStreamEventStore(conn.nc, conn.js)
                ctx = ServiceContext(settings=settings, conn=conn, store=store, metrics=metrics)
                group.create_task(_outliving_outages(service, ctx), name=service.name)
            if not services:
                group.create_task(asyncio.Event().wait(), name="idle")
    finally:
        if server is not None:
            await server.close()
        for conn in conns:
            await conn.close()
        shutdown_tracing()


OUTAGE_RESTARTS = 5
"""Restarts of a service for outages in a row (none lasting a minute of work) before giving up."""
STABLE_AFTER = 60.0


def _outage_error(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_outage_error(inner) for inner in exc.exceptions)
    return isinstance(exc, nats.errors.Error | TimeoutError | StoreUnavailable)


async def _outliving_outages(service: Service, ctx: ServiceContext) -> None:
    """Run ``service``; start it again when a NATS call failed because the server went away
    under it (the connection dropped or came back meanwhile), e.g. during a restart of ``up``'s
    embedded server, which would otherwise end the whole process. Any other failure, or one
    outage too many, still ends it: a service that cannot work must fail loudly.
    """
    loop = asyncio.get_running_loop()
    restarts = 0
    while True:
        reconnects, started = ctx.conn.reconnects, loop.time()
        try:
            await _supervised(service.run(ctx))
            return
        except Exception as exc:
            away = ctx.conn.reconnects != reconnects or not ctx.conn.nc.is_connected
            if loop.time() - started >= STABLE_AFTER:
                restarts = 0
            restarts += 1
            if not (away and _outage_error(exc)) or restarts > OUTAGE_RESTARTS:
                raise
            log.warning(
                "service failed while NATS was away; starting it again",
                service=service.name,
                error=str(exc) or type(exc).__name__,
                restart=restarts,
            )
        while not ctx.conn.nc.is_connected:
            await ctx.conn.reconnected.wait()
        await asyncio.sleep(0.5 * restarts)


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
