"""Run the reconciler and the executor in-process against a real nats-server, for lifecycle tests.

Each reconciler replica gets its own connection, as separate processes would, so JetStream really
spreads messages across replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from events import subjects
from events.schemas import Phase
from events.store import EventStore
from projections.proxy import ProxyView, fold
from services.executor.pure.policy import CommandPolicy
from services.executor.service import ExecutorService
from services.providers.base import Provider
from services.reconciler.service import ReconcilerService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import connect
from services.runtime.observability.metrics import Metrics
from services.runtime.service import Service, ServiceContext
from services.runtime.settings.shared import Settings

FAST = CommandPolicy(
    poll_initial=0.05, poll_max=0.2, backoff_base=0.05, backoff_max=0.2, quota_delay=0.5
)


async def start(url: str, service: Service, tasks: list[asyncio.Task[None]]) -> None:
    conn = await connect(url)
    ctx = ServiceContext(
        settings=Settings(nats_url=url),
        conn=conn,
        store=JetStreamEventStore(conn.nc, conn.js),
        metrics=Metrics(),
    )

    async def run() -> None:
        try:
            await service.run(ctx)
        finally:
            await conn.close()

    tasks.append(asyncio.create_task(run(), name=service.name))


@contextlib.asynccontextmanager
async def fleet(
    url: str,
    providers: Mapping[str, Provider],
    *,
    reconcilers: int = 1,
    data_dir: Path = Path("."),
    observe_interval: float = 0.2,
    replace_unhealthy_after: float = 0.0,
) -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    try:
        for _ in range(reconcilers):
            service = ReconcilerService(replace_unhealthy_after=replace_unhealthy_after)
            await start(url, service, tasks)
        executor = ExecutorService(
            None, data_dir, observe_interval, providers=providers, policy=FAST, ack_wait=5.0
        )
        await start(url, executor, tasks)
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result


async def view(store: EventStore, uid: str) -> ProxyView | None:
    return fold((await store.read(subjects.proxy(uid))).events)


async def phases(store: EventStore, uids: list[str]) -> dict[str, Phase | None]:
    out: dict[str, Phase | None] = {}
    for uid in uids:
        v = await view(store, uid)
        out[uid] = v.phase if v is not None else None
    return out
