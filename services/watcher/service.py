"""The watcher service: Proxy and ProxyPool custom resources → ``declared`` events; the log →
their ``.status``, and the Proxy objects that mirror pool members.

Only the leader works (Lease-based election; ``--no-leader-election`` for a single replica).
Each term starts from nothing: it lists the cluster and folds the log again, so what a previous
leader knew, or was doing when it died, is recovered from the two sources of truth.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import structlog
from kubernetes_asyncio import client as k8s

from events import subjects
from projections import lease as lease_fold
from projections import pool as pool_fold
from projections.lease import LeaseView
from projections.pool import PoolView
from services.runtime.eventlog.projector import Projector
from services.runtime.kube.client import (
    KubeSettings,
    new_api_client,
)
from services.runtime.service import ServiceContext
from services.watcher.board import Board
from services.watcher.leader import LeaderSettings, Leadership
from services.watcher.logview import LogView
from services.watcher.metrics import watcher_metrics
from services.watcher.mirrors import Mirrors
from services.watcher.options import WatcherSettings
from services.watcher.poolkube import PoolApi
from services.watcher.poolsync import PoolSync
from services.watcher.proxykube import ProxyApi
from services.watcher.proxysync import ProxySync
from services.watcher.writer import StatusWriter

log = structlog.get_logger("egress.watcher")


@dataclass
class Term:
    """One leadership term's workers, exposed for tests and metrics."""

    sync: ProxySync
    writer: StatusWriter
    board: Board
    pools: PoolSync


@dataclass
class WatcherService:
    kube: KubeSettings = field(default_factory=KubeSettings)
    leader: LeaderSettings | None = field(default_factory=LeaderSettings)
    """None: no election, this replica always works (one replica only)."""
    resync: float = WatcherSettings().resync_seconds
    retry_delay: float = 1.0
    pool_interval: float = 1.0
    """How often pool statuses and mirrors are brought up to date without a watch event."""
    name: str = "watcher"
    term: Term | None = None
    leadership: Leadership | None = None

    async def run(self, ctx: ServiceContext) -> None:
        api_client = await new_api_client(self.kube)
        try:
            if self.leader is None:
                await self.work(ctx, api_client)
                return
            self.leadership = Leadership(api_client, self.leader)
            await self.leadership.run(lambda: self.work(ctx, api_client))
        finally:
            await api_client.close()

    async def work(self, ctx: ServiceContext, api_client: k8s.ApiClient) -> None:
        """One term: the Proxy, ProxyPool and Secret watches, the status writer and the pool
        keeper (statuses and mirrors), together."""
        api = ProxyApi(api_client)
        logview = LogView(ctx.conn.js)
        board = Board()
        metrics = watcher_metrics(ctx.metrics.registry)
        sync = ProxySync(
            ctx.store,
            api,
            logview,
            board,
            resync=self.resync,
            retry_delay=self.retry_delay,
            metrics=metrics,
        )
        writer = StatusWriter(api, logview, board, sync, retry_delay=self.retry_delay)
        js = ctx.conn.js
        pool_views: Projector[PoolView] = Projector(
            js, subjects.POOL_STREAM, "pool.*.*", pool_fold.apply, idle_timeout=0.5
        )
        leases: Projector[LeaseView] = Projector(
            js, subjects.LEASE_STREAM, "lease.*", lease_fold.apply, idle_timeout=0.5
        )
        pool_api = PoolApi(api_client)
        mirrors = Mirrors(ctx.store, pool_api, board)
        pools = PoolSync(
            ctx.store,
            pool_api,
            logview,
            pool_views,
            leases,
            mirrors=mirrors,
            resync=self.resync,
            retry_delay=self.retry_delay,
            interval=self.pool_interval,
        )
        sync.mirrors, sync.pools = mirrors, pools
        self.term = Term(sync, writer, board, pools)
        metrics.leader.set(1)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(sync.run(), name="watcher.proxies")
                group.create_task(sync.run_secrets(), name="watcher.secrets")
                group.create_task(writer.run(), name="watcher.status")
                group.create_task(pools.run(), name="watcher.pools")
                group.create_task(pools.run_keeper(), name="watcher.pools.keeper")
        finally:
            metrics.leader.set(0)
            self.term = None
            await logview.close()
            await pool_views.close()
            await leases.close()
