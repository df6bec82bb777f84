"""What ``ProxySync`` and ``PoolSync`` share, written once and generic over the kind of object:
the list-then-watch loop (list, watch from the list's resourceVersion, list again when the watch
cannot resume (410 Gone) or every ``resync`` seconds), and the finalizer's steps (set at first
sight, before the first event; on deletion, ask the log and release once it says the aggregate
is gone). Handling one object (``observe``), its departure (``gone``), one listing (``relist``)
and what is appended for it are each kind's own, finite and idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from typing import Any, ClassVar, Generic, TypeVar

from events.errors import EventStoreError
from events.store import EventStore
from services.runtime.aio import raise_if_cancelled
from services.runtime.kube.client import KubeApiError, KubeGone, pause_after
from services.watcher.customobjects import CustomObjectApi, Raw
from services.watcher.logview import LogView
from services.watcher.pure.objects import KubeObject, finalizers_with

Obj = TypeVar("Obj", bound=KubeObject)


class ListWatch(ABC, Generic[Obj]):
    WATCH: ClassVar[str]
    """What the logs call the watch."""
    NOUN: ClassVar[str]
    """What the logs call one object (``proxy``, ``pool``)."""
    log: ClassVar[Any]

    def __init__(
        self,
        store: EventStore,
        api: CustomObjectApi,
        logview: LogView,
        *,
        resync: float,
        retry_delay: float,
    ) -> None:
        self.store = store
        self.api = api
        self.logview = logview
        self.synced: dict[str, int] = {}
        """The generation last brought into the log, per object uid: a watch event that changes
        no generation (our own status patches, mostly) costs no log read."""
        self.resync = resync
        """Seconds between listings (0: only when a watch cannot resume)."""
        self.retry_delay = retry_delay
        self.resource_version = ""
        """The latest the watch (or a listing) reported: where the logs say it stood."""
        self.relists = 0

    @abstractmethod
    async def observe(self, raw: Raw) -> None:
        """An object was added or changed."""

    @abstractmethod
    async def gone(self, raw: Raw) -> None:
        """An object left the cluster."""

    @abstractmethod
    async def relist(self) -> str:
        """Sync every object; the listing's resourceVersion."""

    @abstractmethod
    def parse(self, raw: Raw) -> Obj:
        """One object as the API returned it."""

    @abstractmethod
    async def _sync(self, obj: Obj, force: bool) -> None:
        """Bring the log in line with one object (``force``: even if its generation was synced
        already)."""

    @abstractmethod
    async def request_deletion(self, obj: Obj) -> str:
        """Ask the log to delete the object's aggregate: ``deleted``, ``deleting`` (asked
        already) or ``absent`` (never declared, or removed)."""

    @abstractmethod
    async def release(self, obj: Obj) -> None:
        """Drop our finalizer from an object being deleted, whose aggregate the log says is
        gone."""

    def watch(self, resource_version: str) -> AsyncGenerator[Raw, None]:
        """The objects' watch events from ``resource_version`` on."""
        return self.api.watch_objects(resource_version)

    async def sync_object(self, obj: Obj, *, force: bool = False) -> None:
        """``_sync`` with its errors logged: the object is handled again at its next event or
        the next listing."""
        try:
            await self._sync(obj, force)
        except (KubeApiError, EventStoreError) as exc:
            self.log.warning(
                f"{self.NOUN} not synced, will retry",
                namespace=obj.namespace,
                name=obj.name,
                error=str(exc),
            )

    async def standing(self, obj: Obj) -> Obj | None:
        """The object to bring into the log, our finalizer on it; None when there is none to:
        it is being deleted (``deleting`` handled it), or it moved or is gone."""
        if obj.deleting:
            await self.deleting(obj)
            return None
        return await self.finalized(obj)

    async def finalized(self, obj: Obj) -> Obj | None:
        """The object with our finalizer, set now at first sight: it comes before the first
        event, so nothing the log knows can vanish from the cluster without the log hearing of
        it. None: the object moved or is gone, and its next watch event brings it back."""
        if obj.has_finalizer:
            return obj
        updated = await self.api.set_finalizers(obj, finalizers_with(obj))
        return None if updated is None else self.parse(updated)

    async def deleting(self, obj: Obj) -> None:
        """An object being deleted: deletion requested of the log, and our finalizer released
        at once when the log has nothing that waits for it."""
        if not obj.has_finalizer:
            return
        result = await self.request_deletion(obj)
        if result == "deleted":
            self.log.info(f"{self.NOUN} deletion requested", namespace=obj.namespace, name=obj.name)
        if result == "absent":
            await self.release(obj)

    async def deletion_logged(self, obj: Obj) -> None:
        """``request_deletion`` for an object that left the cluster unseen by us; an error is
        logged, and the next listing asks again."""
        try:
            await self.request_deletion(obj)
        except EventStoreError as exc:
            self.log.warning(
                f"{self.NOUN} deletion not recorded, the next listing retries", error=str(exc)
            )

    async def handle(self, event: dict[str, Any]) -> None:
        kind = str(event.get("type", "")).upper()
        raw = event.get("raw_object") or event.get("object") or {}
        version = (raw.get("metadata") or {}).get("resourceVersion")
        if version:
            self.resource_version = str(version)
        if kind in ("ADDED", "MODIFIED"):
            await self.observe(raw)
        elif kind == "DELETED":
            await self.gone(raw)

    async def run(self) -> None:
        while True:
            raise_if_cancelled()  # nats-py can swallow a cancellation inside an append
            try:
                version = await self.relist()
                # aclosing: a watch left by the resync's timeout, a cancellation or an error
                # closes its connection now, not whenever the abandoned generator is collected.
                async with (
                    asyncio.timeout(self.resync if self.resync > 0 else None),
                    contextlib.aclosing(self.watch(version)) as events,
                ):
                    async for event in events:
                        await self.handle(event)
                        # A cancellation swallowed inside the append would otherwise wait for
                        # the next watch event, which may never come.
                        raise_if_cancelled()
            except TimeoutError:
                continue  # periodic resync: list again
            except KubeGone:
                self.log.info(
                    f"{self.WATCH} expired (410 Gone), listing again", after=self.resource_version
                )
            except (KubeApiError, EventStoreError) as exc:
                # The apiserver or NATS away for a moment: list again once it answers.
                self.log.warning(f"{self.WATCH} failed, listing again", error=str(exc))
                await asyncio.sleep(pause_after(exc, self.retry_delay))
