"""The watcher service: Proxy custom resources → ``declared`` events; the log → ``.status``.

Only the leader works (Lease-based election; ``--no-leader-election`` for a single replica).
Each term starts from nothing: it lists the cluster and folds the log again, so what a previous
leader knew, or was doing when it died, is recovered from the two sources of truth.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import structlog
from kubernetes_asyncio import client as k8s

from services.runtime.kubeclient import (
    KubeSettings,
    new_api_client,
)
from services.runtime.service import ServiceContext
from services.watcher.board import Board
from services.watcher.kube import ProxyApi
from services.watcher.leader import LeaderSettings, Leadership
from services.watcher.logview import LogView
from services.watcher.metrics import watcher_metrics
from services.watcher.sync import ProxySync
from services.watcher.writer import StatusWriter

log = structlog.get_logger("egress.watcher")


@dataclass
class Term:
    """One leadership term's workers, exposed for tests and metrics."""

    sync: ProxySync
    writer: StatusWriter
    board: Board


@dataclass
class WatcherService:
    kube: KubeSettings = field(default_factory=KubeSettings)
    leader: LeaderSettings | None = field(default_factory=LeaderSettings)
    """None: no election, this replica always works (one replica only)."""
    resync: float = 300.0
    retry_delay: float = 1.0
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
        """One term: the proxy watch, the Secret watch and the status writer, together."""
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
        self.term = Term(sync, writer, board)
        metrics.leader.set(1)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(sync.run(), name="watcher.proxies")
                group.create_task(sync.run_secrets(), name="watcher.secrets")
                group.create_task(writer.run(), name="watcher.status")
        finally:
            metrics.leader.set(0)
            self.term = None
            await logview.close()
