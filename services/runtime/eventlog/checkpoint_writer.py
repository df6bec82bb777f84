"""The writer of time-travel checkpoints: one stream folded as time travel folds it, stored every
``every`` stream sequences (``services.runtime.eventlog.checkpoints``).

It reads with its own ordered pull and folds with its own ``ByProxy``, so a checkpoint is what a
replay gives by construction, never a copy of the service's live views (which a snapshot or a
lagging replica could have started elsewhere). On start it resumes from its newest usable
checkpoint; with none, from the stream's first event. A stream whose oldest events aged out while
the writer was away has a gap: the chain starts again from what is stored (its ``origin``).

It runs on the service's event loop, a small batch at a time, yielding between batches; the
packing runs in a thread. A failure is logged and retried later: checkpoints are derived state,
and their absence only makes a time travel replay more, so the writer never stops the service.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from events import reading
from events.errors import EventStoreError, StoreUnavailable
from services.runtime.aio import raise_if_cancelled
from services.runtime.eventlog.asof import ByProxy, Stored
from services.runtime.eventlog.checkpoints import (
    EVERY,
    TRAVELS,
    CheckpointStore,
    Travel,
    nearest,
    stream_bounds,
)
from services.runtime.eventlog.ordered import OrderedPull
from services.runtime.eventlog.pure import checkpoint as cp

log = structlog.get_logger("egress.checkpoints")

V = TypeVar("V")

BATCH = 250
"""Events folded between two yields to the event loop: about 25 ms."""
RETRY = 10.0


@dataclass
class Stats:
    """What a writer did, for its logs and the benchmark."""

    folded: int = 0
    written: int = 0
    skipped: int = 0
    failed: int = 0
    bytes: int = 0
    resumed_from: int = 0
    gaps: int = 0
    last: int = 0
    """The last stream sequence folded."""
    cpu: float = 0.0
    """Thread CPU seconds spent folding and writing (the packing thread's not included)."""


@dataclass
class CheckpointWriter(Generic[V]):
    js: JetStreamContext
    travel: Travel[V]
    every: int = EVERY
    batch: int = BATCH
    idle: float = 1.0
    stats: Stats = field(default_factory=Stats)
    _views: ByProxy[V] = field(init=False)
    _origin: int = field(default=1, init=False)
    _high: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every: {self.every} is not a number of events; use 1 or more")
        self._views = ByProxy(self.travel.apply, self.travel.stream)
        self.store: CheckpointStore[V] = CheckpointStore(self.js, self.travel)

    async def run(self) -> None:
        """Forever; whatever fails is logged and the writer starts again a little later."""
        while True:
            try:
                await self.follow()
            except (EventStoreError, cp.Unusable) as exc:
                log.warning(
                    "checkpoints stopped, again later", stream=self.travel.stream, error=exc
                )
            except Exception:  # derived state: a bug here must not stop the API
                log.exception("checkpoints failed, again later", stream=self.travel.stream)
            raise_if_cancelled()
            await asyncio.sleep(RETRY)

    async def follow(self, *, until_seq: int | None = None) -> None:
        """Resume, then fold and write; returns once ``until_seq`` is folded (None: never)."""
        await self.resume()
        pull = OrderedPull(
            self.js, self.travel.stream, self.travel.filter_subject, batch=self.batch
        )
        pull.last_seq = self.stats.last
        try:
            while until_seq is None or self.stats.last < until_seq:
                msgs = await pull.fetch(self.idle)
                raise_if_cancelled()  # nats-py can swallow a cancellation inside a fetch
                started = time.thread_time()
                for msg in msgs:
                    await self._fold(msg)
                self.stats.cpu += time.thread_time() - started
                await asyncio.sleep(0)
        finally:
            await pull.close()

    async def resume(self) -> None:
        """From the newest usable checkpoint, else from the stream's first stored event."""
        bounds = await stream_bounds(self.js, self.travel.stream)
        await self.store.open(create=True)
        found = await nearest(self.store, bounds, None)
        self._views = ByProxy(self.travel.apply, self.travel.stream)
        if found is None:
            self._origin = max(bounds.first, 1)
            self._high = 0
            self.stats.last = self._origin - 1
        else:
            head, self._views.views = found
            self._origin, self._high, self.stats.last = head.origin, head.high_us, head.seq
        self.stats.resumed_from = self.stats.last
        log.info(
            "checkpoints resumed",
            stream=self.travel.stream,
            after=self.stats.last,
            origin=self._origin,
        )

    async def _fold(self, msg: Msg) -> None:
        meta = msg.metadata
        seq = meta.sequence.stream
        if seq <= self.stats.last:
            return
        if seq != self.stats.last + 1:
            # The events between aged out unread: what is stored now starts a new chain.
            self.stats.gaps += 1
            log.warning("events gone before they were folded, starting again", after=seq)
            self._views = ByProxy(self.travel.apply, self.travel.stream)
            self._origin, self._high = seq, 0
        item, skip = reading.recorded(
            self.travel.stream, seq, msg.subject, meta.timestamp, msg.data, msg.headers
        )
        self._views.fold(Stored(item, skip))
        stamped = cp.micros(meta.timestamp)
        self._high = max(self._high, stamped)
        self.stats.last = seq
        self.stats.folded += 1
        if cp.is_boundary(seq, self.every):
            await self._write(seq, msg.subject, stamped)

    async def _write(self, seq: int, subject: str, stamped: int) -> None:
        try:
            if await self.store.exists(seq):
                self.stats.skipped += 1
                return
            packed = await asyncio.to_thread(cp.pack, dict(self._views.views))
            head = cp.Head(
                format=cp.FORMAT,
                stream=self.travel.stream,
                tag=self.travel.tag,
                seq=seq,
                subject=subject,
                time_us=stamped,
                high_us=self._high,
                origin=self._origin,
                views=packed.views,
                raw=packed.raw,
                packed=len(packed.data),
                chunks=len(packed.chunks()),
                digest=packed.digest,
            )
            if await self.store.write(head, packed):
                self.stats.written += 1
                self.stats.bytes += len(packed.data)
            else:
                self.stats.skipped += 1
        except StoreUnavailable as exc:
            self.stats.failed += 1
            log.warning("checkpoint not written", stream=self.travel.stream, seq=seq, error=exc)


async def write_checkpoints(js: JetStreamContext, every: int = EVERY) -> None:
    """The discovery service's task: a writer per stream time travel folds."""
    writers: list[CheckpointWriter[Any]] = [CheckpointWriter(js, t, every) for t in TRAVELS]
    async with asyncio.TaskGroup() as group:
        for writer in writers:
            group.create_task(writer.run(), name=f"checkpoints-{writer.travel.stream}")
