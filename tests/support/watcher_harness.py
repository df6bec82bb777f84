"""Watcher tests: the emulated apiserver, a real nats-server, the real reconciler and executor
(fake provider), and watcher replicas started and stopped one by one."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events import subjects
from events.schemas import AnyEvent
from services.executor.service import ExecutorService
from services.reconciler.service import ReconcilerService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.testing.provider import FakeProvider
from services.watcher.leader import LeaderSettings
from services.watcher.service import WatcherService
from tests.support.kube import PROXIES, KubeCluster, start_kube
from tests.support.lifecycle import FAST, start

NAMESPACE = "crawl"


def proxy(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"provider": "fake", **spec},
    }


def _task_stacks() -> list[str]:
    out = []
    for task in asyncio.all_tasks():
        buffer = io.StringIO()
        task.print_stack(file=buffer)
        out.append(buffer.getvalue())
    return out


async def stop_task(task: asyncio.Task[None], timeout: float = 15.0) -> None:
    """Cancel until it ends, as ``run_services`` does: nats-py may swallow a cancellation, and
    a loop that then sleeps (the executor's observe sweep) would outlive a single cancel."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not task.done():
        if loop.time() > deadline:
            stack = "".join(_task_stacks())
            raise AssertionError(f"task {task.get_name()} did not stop in {timeout}s:\n{stack}")
        task.cancel()
        # A TaskGroup cancels its children once; a child that lost that cancellation inside
        # nats-py (the executor's observe sweep has no check) is named after the service.
        for child in asyncio.all_tasks():
            if child.get_name().startswith(f"{task.get_name()}-") and child.cancelling():
                child.cancel()
        await asyncio.wait({task}, timeout=0.5)
    with contextlib.suppress(asyncio.CancelledError):
        await task


@contextlib.asynccontextmanager
async def fleet(url: str, fake: FakeProvider, data_dir: Path) -> AsyncIterator[None]:
    """The reconciler and the executor (``tests.support.lifecycle.fleet``, stopped robustly)."""
    tasks: list[asyncio.Task[None]] = []
    try:
        await start(url, ReconcilerService(), tasks)
        executor = ExecutorService(
            None, data_dir, 0.2, providers={"fake": fake}, policy=FAST, ack_wait=5.0
        )
        await start(url, executor, tasks)
        yield
    finally:
        for task in tasks:
            await stop_task(task)


@dataclass
class Replica:
    service: WatcherService
    task: asyncio.Task[None]

    async def stop(self, timeout: float = 15.0) -> None:
        await stop_task(self.task, timeout)


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
        return (await self.store.read(subjects.proxy(uid))).decoded()

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
        async with fleet(url, fake, tmp_path):
            try:
                yield b
            finally:
                for replica in b.replicas:
                    await replica.stop()
