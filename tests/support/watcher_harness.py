"""Watcher tests: the emulated apiserver, a real nats-server, the real reconciler and executor
(fake provider), and watcher replicas started and stopped one by one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events import subjects
from events.jetstream import JetStreamEventStore
from events.schemas import AnyEvent
from services.executor.testing import FakeProvider
from services.watcher.leader import LeaderSettings
from services.watcher.service import WatcherService
from tests.support.kube import PROXIES, KubeCluster, start_kube
from tests.support.lifecycle import fleet, start

NAMESPACE = "crawl"


def proxy(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"provider": "fake", **spec},
    }


@dataclass
class Replica:
    service: WatcherService
    task: asyncio.Task[None]

    async def stop(self) -> None:
        # As ``run_services`` does: nats-py may swallow one cancellation, so repeat it.
        while not self.task.done():
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=0.5)
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@dataclass
class Bench:
    kube: KubeCluster
    url: str
    store: JetStreamEventStore
    fake: FakeProvider
    replicas: list[Replica] = field(default_factory=list)

    async def watcher(self, *, election: bool = False, resync: float = 300.0) -> Replica:
        leader = LeaderSettings(
            namespace="default", lease_duration=3, renew_deadline=2, retry_period=1
        )
        service = WatcherService(
            kube=self.kube.settings,
            leader=leader if election else None,
            resync=resync,
            retry_delay=0.2,
        )
        tasks: list[asyncio.Task[None]] = []
        await start(self.url, service, tasks)
        replica = Replica(service, tasks[0])
        self.replicas.append(replica)
        return replica

    def create(self, name: str, **spec: Any) -> str:
        obj = self.kube.create(PROXIES, proxy(name, **spec), namespace=NAMESPACE)
        return str(obj["metadata"]["uid"])

    def get(self, name: str) -> dict[str, Any] | None:
        return self.kube.get(PROXIES, NAMESPACE, name)

    def status(self, name: str) -> dict[str, Any]:
        obj = self.get(name)
        return dict(obj.get("status") or {}) if obj is not None else {}

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        for cond in self.status(name).get("conditions") or []:
            if cond.get("type") == type_:
                return dict(cond)
        return {}

    async def events(self, uid: str) -> list[AnyEvent]:
        return [r.event for r in (await self.store.read(subjects.proxy(uid))).events]

    async def count(self, uid: str, kind: type) -> int:
        return sum(isinstance(e, kind) for e in await self.events(uid))

    def kube_events(self, name: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.kube.list_objects("v1/events", NAMESPACE)
            if e.get("involvedObject", {}).get("name") == name
        ]


@contextlib.asynccontextmanager
async def bench(
    tmp_path: Path, url: str, store: JetStreamEventStore, *, pending_polls: int = 1
) -> AsyncIterator[Bench]:
    fake = FakeProvider(pending_polls=pending_polls)
    async with start_kube(tmp_path, bookmark_interval=0.5) as kube:
        b = Bench(kube, url, store, fake)
        async with fleet(url, {"fake": fake}, data_dir=tmp_path):
            try:
                yield b
            finally:
                for replica in b.replicas:
                    await replica.stop()
