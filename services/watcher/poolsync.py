"""ProxyPool objects → the pool's ``declared`` events; the log → their ``.status`` and the
mirrors of their members (docs/pools.md, "On Kubernetes").

On Kubernetes the object's ``spec.replicas`` is the truth: a ``kubectl scale`` (or an HPA, or
KEDA, through the scale subresource) changes only the count, and reaches the log as
``PoolScaled``, so members are not re-declared; any other change is ``PoolSpecChanged``. A
finalizer makes ``kubectl delete proxypool`` wait until the pool controller has retired every
member and the log says the pool is removed. An object the CLI's parser refuses gets an
``InvalidSpec`` condition naming the field; nothing is appended for it.

As ``ProxySync`` does for Proxies: handling an object, an event or a listing is finite and
idempotent, the loop (``watchloop.ListWatch``) lists, watches from the listing, and lists again
on 410 Gone or every ``resync`` seconds. ``run_keeper`` brings the log's side into the cluster:
mirrors and status, on every change the watches report and every ``interval`` seconds (the
figures follow the members' Proxies and leases, which no watch of ours reports).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from datetime import UTC, datetime
from typing import Any

import structlog

from commands.pooldeclaring import apply_pool, delete_pool, scale_pool
from events import subjects
from events.errors import EventStoreError
from events.poolresource import pool_uid
from events.store import EventStore
from projections.lease import LeaseView
from projections.pool import PoolView, fold
from projections.pool_members import available_members, member_states
from services.runtime.aio import raise_if_cancelled
from services.runtime.eventlog.projector import Projector
from services.runtime.kube.client import KubeApiError, pause_after
from services.watcher.customobjects import Raw
from services.watcher.logview import LogView
from services.watcher.mirrors import Mirrors
from services.watcher.poolkube import PoolApi
from services.watcher.pure.objects import SOURCE, finalizers_without
from services.watcher.pure.pools import (
    PoolObject,
    log_change,
    parse_pool,
    pool_status,
    status_patch,
)
from services.watcher.watchloop import ListWatch

log = structlog.get_logger("egress.watcher.pools")


class PoolSync(ListWatch[PoolObject]):
    WATCH = "pool watch"
    NOUN = "pool"
    log = log
    api: PoolApi

    def __init__(
        self,
        store: EventStore,
        api: PoolApi,
        logview: LogView,
        pools: Projector[PoolView],
        leases: Projector[LeaseView],
        *,
        mirrors: Mirrors,
        resync: float = 300.0,
        retry_delay: float = 1.0,
        interval: float = 1.0,
    ) -> None:
        super().__init__(store, api, logview, resync=resync, retry_delay=retry_delay)
        self.pools = pools
        self.leases = leases
        self.mirrors = mirrors
        self.interval = interval
        self.objects: dict[str, PoolObject] = {}
        self.written: dict[str, dict[str, Any]] = {}
        self.complete = False
        """Pools and Proxies listed at least once this term: a mirror nobody wants is stale."""
        self.proxies_listed = False
        self.pools_listed = False
        self.wake = asyncio.Event()
        self.lock = asyncio.Lock()
        """One reader of the pool and lease streams at a time."""

    # ------------------------------------------------------------------ one object

    def view_of(self, obj: PoolObject) -> PoolView | None:
        return self.pools.views.get(pool_uid(obj.namespace, obj.name))

    def parse(self, raw: Raw) -> PoolObject:
        return parse_pool(raw)

    async def observe(self, raw: Raw, *, force: bool = False) -> None:
        obj = parse_pool(raw)
        if not obj.uid:
            return
        await self.sync_object(obj, force=force)
        self.wake.set()

    async def _sync(self, obj: PoolObject, force: bool) -> None:
        self.objects[obj.uid] = obj
        standing = await self.standing(obj)
        if standing is None:
            return
        obj = standing
        self.objects[obj.uid] = obj
        if obj.problem is not None or obj.spec is None:
            return
        if not force and self.synced.get(obj.uid) == obj.generation:
            return
        uid = pool_uid(obj.namespace, obj.name)
        view = fold(list((await self.store.read(subjects.pool(uid))).events))
        change = log_change(obj.spec, view)
        if change == "scale" and obj.spec.autoscale is not None and obj.uid not in self.synced:
            # An autoscaled pool sizes itself: an object first seen this term (a re-list, a
            # new leader) does not undo its size; a `kubectl scale` seen happen still sets it,
            # within the autoscaler's bounds (docs/pools.md, "Autoscale").
            self.synced[obj.uid] = obj.generation
            return
        if change == "scale":
            applied = await scale_pool(self.store, obj.namespace, obj.name, obj.spec.replicas)
        else:
            applied = await apply_pool(self.store, obj.namespace, obj.name, obj.spec, SOURCE)
        if applied.result == "deleting":
            return  # deleted from the log (the CLI): declared again once it is removed
        self.synced[obj.uid] = obj.generation
        if applied.result not in ("unchanged",):
            log.info(
                "pool declared",
                namespace=obj.namespace,
                name=obj.name,
                generation=obj.generation,
                result=applied.result,
            )

    async def request_deletion(self, obj: PoolObject) -> str:
        return (await delete_pool(self.store, obj.namespace, obj.name)).result

    async def release(self, obj: PoolObject) -> None:
        """Drop our finalizer: the log says the pool is removed."""
        if await self.api.set_finalizers(obj, finalizers_without(obj)) is not None:
            log.info("pool finalizer released", namespace=obj.namespace, name=obj.name)

    async def gone(self, raw: Raw) -> None:
        """The object left the cluster; with our finalizer only after the pool's removal,
        unless someone removed the finalizer by hand: then its deletion is requested now."""
        obj = parse_pool(raw)
        self.forget(obj.uid)
        self.wake.set()
        await self.deletion_logged(obj)

    def forget(self, uid: str) -> None:
        self.objects.pop(uid, None)
        self.synced.pop(uid, None)
        self.written.pop(uid, None)

    # ------------------------------------------------------------------ one listing

    async def relist(self) -> str:
        """Sync every object; request deletion of the pools Kubernetes declared whose object
        vanished while no watcher ran. The listing's resourceVersion."""
        items, version = await self.api.list_objects()
        self.relists += 1
        await self.catch_up()
        listed = [parse_pool(raw) for raw in items]
        for raw in items:
            await self.observe(raw, force=True)
        present = {o.uid for o in listed}
        for uid in [u for u in self.objects if u not in present]:
            self.forget(uid)
        names = {(o.namespace, o.name) for o in listed}
        for view in list(self.pools.views.values()):
            if view.source != SOURCE or view.removed or view.deleting:
                continue
            if (view.namespace, view.name) not in names:
                log.info("pool deleted while unwatched", namespace=view.namespace, name=view.name)
                await delete_pool(self.store, view.namespace, view.name)
        self.pools_listed = True
        self.complete = self.proxies_listed
        self.resource_version = version
        return version

    def listed_proxies(self) -> None:
        """The Proxy objects were listed (the mirrors among them handed to ``mirrors``)."""
        self.proxies_listed = True
        self.complete = self.pools_listed
        self.wake.set()

    # ------------------------------------------------------------------ the log's side

    async def catch_up(self) -> None:
        async with self.lock:
            await self.pools.catch_up()
            await self.leases.catch_up()

    async def advance(self) -> None:
        async with self.lock:
            await self.pools.step(no_wait=True)
            await self.leases.step(no_wait=True)

    async def run_keeper(self) -> None:
        while True:
            raise_if_cancelled()
            try:
                await self.advance()
                await self.keep()
            except (KubeApiError, EventStoreError) as exc:
                log.warning("pool status or mirrors not written, will retry", error=str(exc))
                await asyncio.sleep(pause_after(exc, self.retry_delay))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self.wake.wait()
            self.wake.clear()

    async def keep(self) -> None:
        """One pass: objects not yet in the log tried again, finalizers of removed pools
        released, mirrors kept, statuses written."""
        now = datetime.now(UTC)
        members = []
        for obj in list(self.objects.values()):
            view = self.view_of(obj)
            if obj.deleting:
                if view is None or view.removed:
                    await self.release(obj)
            elif obj.problem is None and self.synced.get(obj.uid) != obj.generation:
                await self._sync(obj, force=False)
            if view is not None and not view.removed:
                members.append((obj, [(p.member.name, p.member.uid) for p in view.active()]))
        self.mirrors.want(members, self.logview.views)
        await self.mirrors.keep(self.complete)
        for obj in list(self.objects.values()):
            await self._status(obj, now)

    async def _status(self, obj: PoolObject, now: datetime) -> None:
        view = self.view_of(obj)
        proxies, leases = self.logview.views, self.leases.views
        states = {}
        free = 0
        if view is not None:
            states = member_states(view.members.values(), proxies, leases, now)
            free = len(available_members(view, proxies, leases, now))
        previous = self.written.get(obj.uid) or obj.status
        observed = self.synced.get(obj.uid) or int(previous.get("observedGeneration") or 0)
        shown = dataclasses.replace(obj, status=previous)
        desired = pool_status(shown, view, states, free, observed=observed, now=now)
        patch = status_patch(desired, previous)
        if patch is None:
            return
        if await self.api.patch_status(obj.namespace, obj.name, patch):
            self.written[obj.uid] = desired
