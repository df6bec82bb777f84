"""The projector runtime: feeds a stream into a keyed fold and keeps it current.

It reads through ``OrderedPull`` (in order, exactly once, restarting after the last applied
sequence on a gap or a lost consumer), so a rebuild from sequence 1 equals the live view.

With ``snapshots`` it starts from the views a ``Snapshotter`` stored instead (``snapshots``),
skipping per key the events a restored view already holds, and reads the whole stream when
there is no usable set; the views are the same either way.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Generic, TypeVar

import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from events import reading
from events.errors import EventStoreError, StoreUnavailable
from events.store import Recorded
from events.subjects import proxy_uid_of
from services.runtime.aio import raise_if_cancelled
from services.runtime.eventlog.ordered import OrderedPull
from services.runtime.eventlog.push import OrderedPush
from services.runtime.eventlog.skipped import LEDGER
from services.runtime.eventlog.snapshots import SnapshotStore

V = TypeVar("V")
Apply = Callable[[V | None, Recorded], V]

log = structlog.get_logger("egress.projector")


class Projector(Generic[V]):
    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        filter_subject: str,
        apply: Apply[V],
        *,
        key: Callable[[str], str] = proxy_uid_of,
        batch: int = 1000,
        idle_timeout: float = 1.0,
        snapshots: SnapshotStore[V] | None = None,
        restored: Callable[[str, V], None] = lambda key, view: None,
    ) -> None:
        self.stream = stream
        self.filter_subject = filter_subject
        self.apply = apply
        self.key = key
        self.idle_timeout = idle_timeout
        self.views: dict[str, V] = {}
        self.applied = 0
        self.skipped = 0
        self._reader = OrderedPull(js, stream, filter_subject, batch=batch)
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._tickets = itertools.count()
        self.push: OrderedPush | None = None
        """Set while ``follow`` keeps the views current by push."""
        self._js = js
        self.snapshots = snapshots
        self.restored = restored
        """Called for every view taken from a snapshot (derived indices are rebuilt from it)."""
        self.restored_views = 0
        self.as_of: dict[str, int] = {}
        """key -> the sequence its restored view is complete as of (its events up to it skip)."""
        self.changed: set[str] = set()
        """Keys whose view changed since a ``Snapshotter`` last took them."""

    @property
    def last_seq(self) -> int:
        return self._reader.last_seq

    @property
    def batch(self) -> int:
        return self._reader.batch

    @batch.setter
    def batch(self, value: int) -> None:
        self._reader.batch = value

    async def catch_up(self) -> int:
        """Apply everything in the stream now; returns how many events were applied.

        Ends only when the server reports nothing left: an empty short fetch alone can also mean
        a busy event loop, and a view built from half the stream would look complete.
        """
        if self.snapshots is not None and self._reader.last_seq == 0 and not self.views:
            await self._restore(self.snapshots)
        before = self.applied
        remaining = await self._reader.pending()
        drained = False
        while remaining > 0:
            # After an empty short fetch, a full one gives late messages time to arrive.
            got = await self.step(no_wait=not drained)
            if got:
                drained = False
                remaining = self._reader.num_pending
                continue
            server, queued = await self._reader.pending_parts()
            if server == 0 and drained:
                # A full fetch drained the local queue and found nothing: what is still queued
                # is a late status message ("request timeout") that no fetch returns. Counting
                # it would spin here for ever.
                break
            drained = server == 0
            remaining = server + queued
        return self.applied - before

    async def _restore(self, snapshots: SnapshotStore[V]) -> None:
        try:
            info = await self._js.stream_info(self.stream)
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot read {self.stream}: {exc}") from exc
        got = await snapshots.restore(info.state.last_seq)
        if got is None:
            return
        self.views = got.views
        self.as_of = got.as_of
        self._reader.last_seq = got.start - 1
        for key, view in got.views.items():
            self.restored(key, view)
        self.restored_views = len(got.views)
        log.info(
            "views restored from snapshots",
            stream=self.stream,
            views=len(got.views),
            start=got.start,
        )

    async def run(self) -> None:
        await self.catch_up()
        while True:
            raise_if_cancelled()
            try:
                await self.step()
            except EventStoreError as exc:
                log.warning("projector cannot read yet", stream=self.stream, error=str(exc))
                await asyncio.sleep(self.idle_timeout)

    async def follow(self, nc: NATS, *, heartbeat: float = 2.0) -> None:
        """After ``catch_up``: keep the views current by push, each event applied the moment it
        is stored (``push.py``), for ever. For a view that answers read-your-writes waits:
        ``step`` costs a request per answer, or holds events for a window under load."""
        await self._reader.close()
        self.push = OrderedPush(
            nc, self._js, self.stream, self.filter_subject, self._pushed, heartbeat=heartbeat
        )
        try:
            await self.push.run(self._reader.last_seq)
        finally:
            self.push = None

    def _pushed(self, msg: Msg) -> None:
        self._apply(msg)
        self._reader.last_seq = msg.metadata.sequence.stream
        self._wake()

    async def wait_for(self, seq: int, timeout: float = 10.0) -> None:
        """Read-your-writes: wait until the view includes stream sequence ``seq``.

        Each waiter has its own future, woken when its sequence is applied: a shared condition
        would wake every waiting request on every event."""
        if self.last_seq >= seq:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (seq, next(self._tickets), waiter))
        try:
            async with asyncio.timeout(timeout):
                await waiter
        finally:
            waiter.cancel()  # a timed-out waiter is dropped when its sequence comes

    def _wake(self) -> None:
        seq = self.last_seq
        while self._waiters and self._waiters[0][0] <= seq:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():
                waiter.set_result(None)

    async def close(self) -> None:
        await self._reader.close()

    async def step(self, *, no_wait: bool = False) -> int:
        """Fetch one batch and apply it; returns how many messages were applied."""
        msgs = await self._reader.fetch(0.05 if no_wait else self.idle_timeout)
        for msg in msgs:
            self._apply(msg)
        if msgs:
            self._wake()
        return len(msgs)

    def _apply(self, msg: Msg) -> None:
        """Fold one message; never raises on what the message holds.

        An event that does not decode, or that the fold cannot apply, is folded as an
        ``Unreadable`` placeholder: the view moves past it (its last sequence included, which
        writers use for optimistic concurrency), and the skip is counted and logged once.
        """
        meta = msg.metadata
        item, skip = reading.recorded(
            self.stream,
            meta.sequence.stream,
            msg.subject,
            meta.timestamp,
            msg.data,
            msg.headers,
        )
        key = self.key(msg.subject)
        if self.as_of and meta.sequence.stream <= self.as_of.get(key, 0):
            return  # the restored view holds it already
        self.changed.add(key)
        view, failed = reading.apply_tolerantly(self.apply, self.views.get(key), item, self.stream)
        skip = skip or failed
        if view is not None:
            self.views[key] = view
        if skip is not None:
            self.skipped += 1
            if LEDGER.note(skip):
                log.warning("projector skipped an event no fold can use", **skip.fields())
            return
        self.applied += 1
