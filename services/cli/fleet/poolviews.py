"""The pools as the CLI sees them: the POOL stream folded with the proxy and lease views its
members are judged by (the pool controller's three folds, ``services.pools.service``), read once
for ``get pools``, followed for ``apply --wait`` and ``delete pool --wait``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from events import subjects
from events.pool import PoolDecided
from events.poolresource import pool_uid
from events.subjects import LEASE_STREAM, POOL_STREAM, PROXY_STREAM
from projections import lease as lease_fold
from projections import pool as pool_fold
from projections import proxy as proxy_fold
from projections.lease import LeaseView
from projections.pool import PoolView
from projections.proxy import ProxyView
from services.cli.common import stdout_console
from services.cli.pure.pool_render import Decided, PoolRow, pool_row
from services.runtime.eventlog import checkpoints
from services.runtime.eventlog.checkpoints import fold_at
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.projector import Projector
from services.runtime.nats.connection import Connection


@dataclass(frozen=True, slots=True)
class Fleet:
    pools: dict[str, PoolView]
    proxies: dict[str, ProxyView]
    leases: dict[str, LeaseView]

    def rows(self, namespace: str | None, now: datetime) -> list[PoolRow]:
        """The pools ``get pools`` lists: declared, not removed, by namespace and name."""
        views = [v for v in self.pools.values() if v.name and not v.removed]
        if namespace:
            views = [v for v in views if v.namespace == namespace]
        views.sort(key=lambda v: (v.namespace, v.name))
        return [pool_row(v, self.proxies, self.leases, now) for v in views]


class Following:
    """The three projections, caught up, then stepped while a command waits."""

    def __init__(self, conn: Connection) -> None:
        js = conn.js
        self.pools: Projector[PoolView] = Projector(js, POOL_STREAM, "pool.*.*", pool_fold.apply)
        self.proxies: Projector[ProxyView] = Projector(
            js, PROXY_STREAM, "proxy.*.*", proxy_fold.apply
        )
        self.leases: Projector[LeaseView] = Projector(js, LEASE_STREAM, "lease.*", lease_fold.apply)
        self.all = (self.pools, self.proxies, self.leases)

    async def catch_up(self) -> None:
        for projector in self.all:
            await projector.catch_up()

    async def step(self) -> None:
        """Whatever arrived since, waiting for at most one idle fetch (about a second)."""
        await self.pools.step(no_wait=True)
        await self.leases.step(no_wait=True)
        await self.proxies.step()

    async def close(self) -> None:
        for projector in self.all:
            await projector.close()

    def fleet(self) -> Fleet:
        return Fleet(self.pools.views, self.proxies.views, self.leases.views)


async def fleet(conn: Connection, at: datetime | None = None) -> Fleet:
    """The three views now, or folded from the log up to ``at`` (``get pools --at``)."""
    if at is None:
        following = Following(conn)
        try:
            await following.catch_up()
        finally:
            await following.close()
        return following.fleet()
    # Each from its nearest checkpoint before ``at`` (services.runtime.eventlog.checkpoints).
    pools = await fold_at(conn.js, checkpoints.POOL, at)
    proxies = await fold_at(conn.js, checkpoints.PROXY, at)
    leases = await fold_at(conn.js, checkpoints.LEASE, at)
    return Fleet(pools.views, proxies.views, leases.views)


async def history(
    conn: Connection, namespace: str, name: str
) -> tuple[PoolView | None, list[Decided]]:
    """One pool as its aggregate holds it, and every decision with the time it was stored."""
    store = JetStreamEventStore(conn.nc, conn.js)
    read = await store.read(subjects.pool(pool_uid(namespace, name)))
    view = pool_fold.fold(list(read.events))
    decisions = [
        Decided(at=r.timestamp, event=r.event)
        for r in read.events
        if isinstance(r.event, PoolDecided)
    ]
    return view, decisions


Done = Callable[[PoolRow | None], bool]
Label = Callable[[list[PoolRow | None]], str]


async def wait_for(
    conn: Connection, keys: list[tuple[str, str]], done: Done, label: Label, timeout: float
) -> list[PoolRow | None]:
    """Follow the views until ``done`` holds for every pool (namespace, name) or the time ran
    out, with a spinner saying ``label``; the pools as they were then, in ``keys`` order (None:
    not in the log, or removed)."""
    following = Following(conn)
    console = stdout_console()
    uids = [pool_uid(ns, name) for ns, name in keys]

    def rows() -> list[PoolRow | None]:
        fleet = following.fleet()
        now = datetime.now(UTC)
        out: list[PoolRow | None] = []
        for uid in uids:
            view = fleet.pools.get(uid)
            if view is None or view.removed:
                out.append(None)
            else:
                out.append(pool_row(view, fleet.proxies, fleet.leases, now))
        return out

    try:
        await following.catch_up()
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            # A spinner is for a person: into a pipe or a file it would print a blank line.
            disable=not console.is_terminal,
        ) as progress:
            task = progress.add_task(label(rows()))
            async with asyncio.timeout(timeout):
                while True:
                    now = rows()
                    progress.update(task, description=label(now))
                    if all(done(row) for row in now):
                        break
                    await following.step()
    except TimeoutError:
        pass
    finally:
        await following.close()
    return rows()
