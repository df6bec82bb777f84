"""The list-then-watch loop ``ProxySync`` and ``PoolSync`` share: list, watch from the list's
resourceVersion, list again when the watch cannot resume (410 Gone) or every ``resync``
seconds. Handling one object (``observe``), its departure (``gone``) and one listing
(``relist``) are each kind's own, finite and idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from typing import Any, ClassVar

from events.errors import EventStoreError
from services.runtime.aio import raise_if_cancelled
from services.runtime.kubeclient import KubeApiError, KubeGone, pause_after
from services.watcher.kube import Raw


class ListWatch(ABC):
    WATCH: ClassVar[str]
    """What the logs call the watch."""
    log: ClassVar[Any]

    def __init__(self, *, resync: float, retry_delay: float) -> None:
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
    def watch(self, resource_version: str) -> AsyncGenerator[Raw, None]:
        """The objects' watch events from ``resource_version`` on."""

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
