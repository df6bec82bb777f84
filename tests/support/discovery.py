"""Discovery under test: Ready proxies appended straight to the log, the real service on uvicorn.

Proxies become Ready the way the reconciler would record it (``ProxyDeclared`` then
``PhaseChanged(Ready)``), without running the reconciler or a provider: the API reads only the log.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path

import httpx

from events import subjects
from events.schemas import (
    Condition,
    HealthChanged,
    LeaseAcquired,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
)
from events.store import EventStore, NewEvent
from projections.egress import EgressPolicy
from services.discovery.service import DiscoveryService, parse_trusted_proxies
from services.runtime.clients import Clients
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import connect
from services.runtime.observability.metrics import Metrics
from services.runtime.service import ServiceContext
from services.runtime.settings.shared import Settings


async def ready_proxy(
    store: EventStore,
    uid: str,
    attributes: dict[str, str] | None = None,
    *,
    port: int = 3128,
    phase: Phase = Phase.READY,
    healthy: bool | None = True,
    namespace: str = "crawl",
    name: str = "",
    provider: str = "local",
) -> int:
    """A proxy as the reconciler leaves it once its instance runs and, unless ``healthy`` is
    None, as the health service then finds it; returns the last sequence. ``name`` defaults to
    ``px-<uid>``."""
    spec = ProxySpec(provider=provider, attributes=attributes or {})
    declared = ProxyDeclared(uid=uid, namespace=namespace, name=name or f"px-{uid}", spec=spec)
    ready = PhaseChanged(
        phase=phase,
        reason="InstanceRunning",
        ip="127.0.0.1",
        url=f"http://127.0.0.1:{port}" if phase is Phase.READY else "",
        provider_id=f"local-{uid}",
        conditions=(Condition(type="Ready", status=str(phase is Phase.READY), reason="Running"),),
    )
    events = [NewEvent(declared, f"declared-{uid}"), NewEvent(ready, f"ready-{uid}")]
    if healthy is not None:
        verdict = HealthChanged(healthy=healthy, reason="Probe", latency_ms=12.0)
        events.append(NewEvent(verdict, f"first-verdict-{uid}"))
    result = await store.append(subjects.proxy(uid), events)
    return result.last_seq


async def set_health(store: EventStore, uid: str, healthy: bool, latency_ms: float = 0.0) -> None:
    event = HealthChanged(healthy=healthy, reason="Probe", latency_ms=latency_ms)
    msg_id = f"health-{uid}-{healthy}-{latency_ms}"
    await store.append(subjects.proxy(uid), [NewEvent(event, msg_id)])


@contextlib.asynccontextmanager
async def discovery(
    url: str,
    *,
    max_lease_ttl: float = 3600.0,
    lease_cooldown: float = 0.0,
    block_backoff: float = 600.0,
    token: str | None = None,
    expiry_interval: float = 0.1,
    metrics: Metrics | None = None,
    snapshot_interval: float = 30.0,
    clients_file: Path | None = None,
    egress: EgressPolicy | None = None,
    trusted_proxies: str = "",
    budget_clock: Callable[[], datetime] | None = None,
) -> AsyncIterator[tuple[DiscoveryService, str]]:
    """A discovery replica with its own NATS connection, listening on a free loopback port;
    yields the service and its base URL. ``clients_file``: the API's clients
    (``services.runtime.clients``); ``egress``: how it judges egress findings (``--egress-*``);
    ``trusted_proxies``: whose forwarded headers it believes (``--trusted-proxies``);
    ``budget_clock``: which UTC day it is for upstream budgets (D162)."""
    conn = await connect(url)
    service = DiscoveryService(
        host="127.0.0.1",
        port=0,
        max_lease_ttl=max_lease_ttl,
        lease_cooldown=lease_cooldown,
        block_backoff=block_backoff,
        token=token,
        expiry_interval=expiry_interval,
        shutdown_timeout=1.0,
        snapshot_interval=snapshot_interval,
        clients=Clients(clients_file, token),
        egress=egress or EgressPolicy(),
        trusted_proxies=parse_trusted_proxies(trusted_proxies),
    )
    if budget_clock is not None:
        service.budget_clock = budget_clock
    ctx = ServiceContext(
        settings=Settings(nats_url=url),
        conn=conn,
        store=JetStreamEventStore(conn.nc, conn.js),
        metrics=metrics or Metrics(),
    )
    task = asyncio.create_task(service.run(ctx))
    try:
        async with asyncio.timeout(20):
            waiter = asyncio.create_task(service.listening.wait())
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if task.done():
                await task  # raises what stopped it
        yield service, f"http://127.0.0.1:{service.bound_port}"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await conn.close()


def bearer_client(base: str, token: str, *, timeout: float = 10) -> httpx.AsyncClient:
    """An API client of the clients file's, sending ``token`` as every request's bearer."""
    return httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
    )


async def grant_seq(store: EventStore, uid: str, lease_id: str) -> int:
    """The stream sequence of the ``LeaseAcquired`` that claimed ``lease_id`` on ``uid``: the
    fencing token its grant carries (docs/api.md, Guarantees)."""
    history = await store.read(subjects.lease(uid))
    (seq,) = (
        r.seq
        for r in history.events
        if isinstance(r.event, LeaseAcquired) and r.event.lease_id == lease_id
    )
    return seq
