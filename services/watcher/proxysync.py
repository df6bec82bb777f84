"""Proxy objects → ``declared`` events, and the finalizer that makes deletion wait for the log.

Every step here is finite and idempotent: handling one object (``observe``), one watch event
(``handle``), one listing (``relist``). The loop in ``run`` (``watchloop.ListWatch``) only
strings them together: list, watch from the list's resourceVersion, list again when the watch
cannot resume (410 Gone) or every ``resync`` seconds. Appends are decided on the folded aggregate
(``commands.declaring``), so handling an object twice, or by two watchers, stores nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

import structlog
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from commands.declaring import Declaration, apply, delete
from events.errors import EventStoreError
from events.store import EventStore
from services.runtime.aio import raise_if_cancelled
from services.runtime.kube.client import KubeApiError, pause_after
from services.watcher.board import Board
from services.watcher.customobjects import Raw
from services.watcher.logview import LogView
from services.watcher.metrics import WatcherMetrics
from services.watcher.proxykube import ProxyApi
from services.watcher.pure.objects import (
    SOURCE,
    Problem,
    ProxyObject,
    finalizers_without,
    parse_proxy,
    resolve_cloud_init,
)
from services.watcher.pure.tracked import vanished
from services.watcher.watchloop import ListWatch

if TYPE_CHECKING:
    from services.watcher.mirrors import Mirrors
    from services.watcher.poolsync import PoolSync

log = structlog.get_logger("egress.watcher")
_tracer = trace.get_tracer("egress_proxies.watcher")


class ProxySync(ListWatch[ProxyObject]):
    WATCH = "watch"
    NOUN = "proxy"
    log = log
    api: ProxyApi

    def __init__(
        self,
        store: EventStore,
        api: ProxyApi,
        logview: LogView,
        board: Board,
        *,
        resync: float = 300.0,
        retry_delay: float = 1.0,
        metrics: WatcherMetrics | None = None,
    ) -> None:
        super().__init__(store, api, logview, resync=resync, retry_delay=retry_delay)
        self.metrics = metrics or WatcherMetrics(CollectorRegistry())
        self.board = board
        self.mirrors: Mirrors | None = None
        """Where the Proxy objects that mirror pool members go instead (``mirrors``): they are
        no Proxies of their own, and are never declared."""
        self.pools: PoolSync | None = None

    # ------------------------------------------------------------------ one object

    async def observe(self, raw: Raw) -> None:
        if self.mirrors is not None and self.mirrors.claims(raw):
            self.mirrors.observed(raw)
            if self.pools is not None:
                self.pools.wake.set()
            return
        obj = parse_proxy(raw)
        if obj.uid:
            await self.sync_object(obj)

    def parse(self, raw: Raw) -> ProxyObject:
        return parse_proxy(raw)

    async def _sync(self, obj: ProxyObject, force: bool) -> None:
        self.board.put(obj)
        standing = await self.standing(obj)
        if standing is None:
            return
        obj = standing
        self.board.put(obj)
        if obj.invalid is not None or obj.spec is None:
            self.board.set_problem(obj.uid, obj.invalid)
            return
        if not force and self.synced.get(obj.uid) == obj.generation:
            return
        cloud_init = await self._cloud_init(obj)
        if isinstance(cloud_init, Problem):
            self.board.set_problem(obj.uid, cloud_init)
            return
        self.board.set_problem(obj.uid, None)
        declaration = Declaration(
            uid=obj.uid,
            namespace=obj.namespace,
            name=obj.name,
            spec=obj.spec,
            source=SOURCE,
            generation=obj.generation,
            cloud_init=cloud_init,
        )
        # The root of the trace a `kubectl apply` becomes: reconciler, executor and the status
        # patch continue it through the event headers.
        with _tracer.start_as_current_span(
            "watcher.declare",
            attributes={
                "proxy.uid": obj.uid,
                "k8s.namespace.name": obj.namespace,
                "proxy.name": obj.name,
                "proxy.generation": obj.generation,
            },
        ) as span:
            applied = await apply(self.store, declaration)
            span.set_attribute("watcher.result", applied.result)
        self.synced[obj.uid] = obj.generation
        self.metrics.declarations.labels(applied.result).inc()
        if applied.result in ("created", "changed"):
            log.info(
                "proxy declared",
                namespace=obj.namespace,
                name=obj.name,
                uid=obj.uid,
                generation=obj.generation,
                result=applied.result,
            )

    async def _cloud_init(self, obj: ProxyObject) -> str | Problem:
        secret = None
        if obj.secret_name:
            secret = await self.api.read_secret(obj.namespace, obj.secret_name)
        return resolve_cloud_init(obj, secret)

    async def request_deletion(self, obj: ProxyObject) -> str:
        return (await delete(self.store, obj.namespace, obj.name, obj.uid)).result

    async def release(self, obj: ProxyObject) -> None:
        if not obj.deleting or not obj.has_finalizer:
            return
        updated = await self.api.set_finalizers(obj, finalizers_without(obj))
        if updated is not None:
            log.info("finalizer released", namespace=obj.namespace, name=obj.name)

    async def released_in_log(self, uid: str) -> None:
        """The log says the proxy is removed: release its object if it waits for that."""
        obj = self.board.objects.get(uid)
        if obj is None or not obj.deleting:
            return
        fresh = await self.api.get_object(obj.namespace, obj.name)
        if fresh is None:
            self.forget(uid)
            return
        current = parse_proxy(fresh)
        if current.uid == uid:
            await self.release(current)

    async def gone(self, raw: Raw) -> None:
        """The object left the cluster. With our finalizer that happens only after removal,
        unless someone removed the finalizer by hand: then deletion is requested now."""
        if self.mirrors is not None and self.mirrors.claims(raw):
            try:
                await self.mirrors.gone(raw)
            except EventStoreError as exc:
                log.warning("member not replaced after its mirror's deletion", error=str(exc))
            if self.pools is not None:
                self.pools.wake.set()
            return
        obj = parse_proxy(raw)
        self.forget(obj.uid)
        await self.deletion_logged(obj)

    def forget(self, uid: str) -> None:
        self.board.forget(uid)
        self.synced.pop(uid, None)

    # ------------------------------------------------------------------ one listing

    async def relist(self) -> str:
        """Sync every object, request deletion of what vanished; the list's resourceVersion."""
        items, version = await self.api.list_objects()
        self.relists += 1
        self.metrics.relists.inc()
        await self.logview.sync()
        if self.mirrors is not None:
            mirrors = self.mirrors
            self.mirrors.listed(raw for raw in items if mirrors.claims(raw))
            items = [raw for raw in items if not mirrors.claims(raw)]
        if self.pools is not None:
            self.pools.listed_proxies()
        listed = [parse_proxy(raw) for raw in items]
        for obj in listed:
            if obj.uid:
                await self.sync_object(obj, force=True)
        await self._vanished({obj.uid for obj in listed})
        self.resource_version = version
        return version

    async def _vanished(self, listed: Iterable[str]) -> None:
        present = set(listed)
        for uid in list(self.board.objects):
            if uid not in present:
                self.forget(uid)
        for uid in vanished(present, self.logview.views):
            view = self.logview.views[uid]
            log.info("proxy deleted while unwatched", namespace=view.namespace, name=view.name)
            try:
                await delete(self.store, view.namespace, view.name, uid)
            except EventStoreError as exc:
                log.warning("deletion not recorded, the next listing retries", error=str(exc))

    # ------------------------------------------------------------------ Secrets

    async def run_secrets(self) -> None:
        """A labelled Secret changed: re-resolve the proxies that use it (a rotation replaces
        their instances through the new spec hash)."""
        while True:
            raise_if_cancelled()
            try:
                async with contextlib.aclosing(self.api.watch_secrets()) as events:
                    async for event in events:
                        if str(event.get("type", "")).upper() == "BOOKMARK":
                            continue
                        meta = (event.get("raw_object") or {}).get("metadata") or {}
                        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
                        await self._secret_changed(namespace, name)
                        raise_if_cancelled()
            except KubeApiError as exc:
                log.warning("secret watch failed, starting again", error=str(exc))
                await asyncio.sleep(pause_after(exc, self.retry_delay))

    async def _secret_changed(self, namespace: str, name: str) -> None:
        users = [
            obj
            for obj in list(self.board.objects.values())
            if obj.namespace == namespace and obj.secret_name == name and not obj.deleting
        ]
        for obj in users:
            await self.sync_object(obj, force=True)
