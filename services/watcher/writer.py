"""The status writer: keeps each Proxy's ``.status`` equal to its projection of the log.

The loop reads the ``PROXY`` stream in order (``LogView``); after each batch it recomputes the
status of every proxy that changed (in the log, or on the board: a new object, a cloud-init
problem) and patches only when the result differs from what the object shows. Each patch is a
``status.patch`` span continuing the trace of the event that caused it, so a ``kubectl apply``
is one trace from the watcher's append to the status the user sees.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import structlog
from opentelemetry import propagate, trace

from events.errors import EventStoreError
from services.runtime.aio import raise_if_cancelled
from services.runtime.kube.client import KubeApiError, pause_after
from services.watcher.board import Board
from services.watcher.logview import LogView
from services.watcher.metrics import WatcherMetrics
from services.watcher.proxykube import ProxyApi
from services.watcher.proxysync import ProxySync
from services.watcher.pure.status import desired_status, differs, notices, patch_body

log = structlog.get_logger("egress.watcher.status")
_tracer = trace.get_tracer("egress_proxies.watcher")


class StatusWriter:
    def __init__(
        self,
        api: ProxyApi,
        logview: LogView,
        board: Board,
        sync: ProxySync,
        *,
        retry_delay: float = 1.0,
        metrics: WatcherMetrics | None = None,
    ) -> None:
        self.metrics = metrics or sync.metrics
        self.api = api
        self.logview = logview
        self.board = board
        self.sync = sync
        self.retry_delay = retry_delay
        self.written: dict[str, dict[str, Any]] = {}
        self.patches = 0

    async def run(self) -> None:
        await self._catch_up()
        while True:
            raise_if_cancelled()  # nats-py can swallow a cancellation inside a fetch
            try:
                await self.logview.advance()
            except EventStoreError as exc:
                log.warning("cannot read the log yet", error=str(exc))
                await asyncio.sleep(self.retry_delay)
            pause = await self.flush()
            if pause:
                await asyncio.sleep(pause)

    async def _catch_up(self) -> None:
        """Fold the whole log before the first write: a new leader must not patch statuses
        from a half-read history (they would flap back to old phases)."""
        while True:
            raise_if_cancelled()
            try:
                await self.logview.sync()
                return
            except EventStoreError as exc:
                log.warning("cannot read the log yet", error=str(exc))
                await asyncio.sleep(self.retry_delay)

    async def flush(self) -> float:
        """Write every changed proxy's status; how long to wait before the next flush: 0 when
        all were written, else the retry delay, or longer when the apiserver asked for it.

        A throttled apiserver (429 with ``Retry-After``) stops the flush: the statuses not yet
        written stay marked, and nothing is sent until the pause it asked for is over."""
        uids = sorted(self.logview.take_changed() | self.board.take_dirty())
        pause = 0.0
        for i, uid in enumerate(uids):
            try:
                await self.write(uid)
            except KubeApiError as exc:
                self.metrics.status_patches.labels("failed").inc()
                log.warning(
                    "status not written, will retry",
                    proxy_uid=uid,
                    error=str(exc),
                    retry_after=exc.retry_after or None,
                )
                self.board.mark(uid)
                pause = pause_after(exc, self.retry_delay)
                if exc.retry_after:
                    for later in uids[i + 1 :]:
                        self.board.mark(later)
                    break
        return pause

    async def write(self, uid: str) -> None:
        view = self.logview.views.get(uid)
        obj = self.board.objects.get(uid) or self.board.mirrors.get(uid)
        if view is not None and view.removed:
            await self.sync.released_in_log(uid)
            return
        if obj is None:
            self.written.pop(uid, None)
            return  # not a custom resource we know (e.g. declared by the CLI), or gone
        if obj.deleting and view is None:
            return
        # By the object's uid: a member's mirror deleted and made again is a new object.
        previous = self.written.get(obj.uid) or obj.status
        now = view.updated_at if view is not None and view.updated_at else datetime.now(UTC)
        desired = desired_status(
            view,
            self.board.problems.get(uid),
            generation=obj.generation,
            previous=previous,
            now=now,
        )
        if uid != obj.uid:
            # A mirror shows its member's status for the spec it is kept at, its own.
            desired["observedGeneration"] = obj.generation
        if not differs(desired, previous):
            return
        parent = propagate.extract(self.logview.carriers.get(uid, {}))
        with _tracer.start_as_current_span(
            "status.patch",
            context=parent,
            attributes={
                "proxy.uid": uid,
                "k8s.namespace.name": obj.namespace,
                "proxy.name": obj.name,
                "proxy.phase": str(desired["phase"]),
            },
        ):
            if not await self.api.patch_status(
                obj.namespace, obj.name, patch_body(desired, previous)
            ):
                self.metrics.status_patches.labels("gone").inc()
                return  # the object is gone; its DELETED event does the rest
            self.written[obj.uid] = desired
            self.patches += 1
            self.metrics.status_patches.labels("ok").inc()
            cause = str(view.last_seq) if view is not None else "cluster"
            for notice in notices(previous, desired):
                await self.api.record_event(obj, notice, cause)
                self.metrics.kube_events.inc()
        log.info(
            "status written",
            namespace=obj.namespace,
            name=obj.name,
            phase=desired["phase"],
            ip=desired.get("ip", ""),
        )
