"""The writer of time-travel checkpoints: one stream folded as time travel folds it, stored every
``every`` stream sequences (``services.runtime.eventlog.checkpoints``), as a delta of the
previous checkpoint or, when the deltas since the last full one have grown to ``cp.FULL_RATIO``
of it, a full one (docs/decisions/0163-checkpoints-as-deltas.md).

One discovery replica writes a stream's checkpoints: the holder of its key in the
``CHECKPOINT_LOCK`` bucket (``services.runtime.kvlock``). The others wait, trying the lock every
third of its TTL, and one of them takes over within the TTL when the holder dies; a holder that
loses its lock (it could not refresh it in time) stops writing at once.

It reads with its own ordered pull and folds with its own ``ByProxy``, so a checkpoint is what a
replay gives by construction, never a copy of the service's live views (which a snapshot or a
lagging replica could have started elsewhere). On start it resumes from its newest usable
checkpoint, folding its chain as a reader does; with none, from the stream's first event. A
stream whose oldest events aged out while the writer was away has a gap: a new chain starts,
with a full checkpoint, from what is stored (its ``origin``).

It runs on the service's event loop, a small batch at a time, yielding between batches; the
packing runs in a thread. A failure is logged and retried later: checkpoints are derived state,
and their absence only makes a time travel replay more, so the writer never stops the service.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec
import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from events import reading
from events.errors import EventStoreError, StoreUnavailable
from services.runtime.aio import raise_if_cancelled
from services.runtime.eventlog.asof import ByProxy, Stored
from services.runtime.eventlog.batched import BatchedPull
from services.runtime.eventlog.checkpoints import (
    EVERY,
    TRAVELS,
    CheckpointStore,
    Travel,
    nearest,
    stream_bounds,
)
from services.runtime.eventlog.pure import checkpoint as cp
from services.runtime.kvlock import Held, KvLock
from services.runtime.nats.users import CHECKPOINT_LOCK

log = structlog.get_logger("egress.checkpoints")

V = TypeVar("V")

BATCH = 250
"""Events asked for at once, and at most folded between two yields to the event loop: about
10 ms."""
RETRY = 10.0
LOCK_TTL = 30.0
"""Seconds a dead writer's lock blocks the next one: checkpoints then lag by that much more."""


@dataclass
class Stats:
    """What a writer did, for its logs and the benchmark."""

    folded: int = 0
    written: int = 0
    fulls: int = 0
    """Of ``written``, the full ones (the others are deltas)."""
    failed: int = 0
    bytes: int = 0
    full_bytes: int = 0
    """Of ``bytes``, the full ones'."""
    unusable: int = 0
    """Checkpoints found unusable when resuming (it resumed from an older point)."""
    waits: int = 0
    """Times it found the lock held by another writer."""
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
    lock_ttl: float = LOCK_TTL
    _views: ByProxy[V] = field(init=False)
    _origin: int = field(default=1, init=False)
    _high: int = field(default=0, init=False)
    _base: dict[str, V] = field(default_factory=dict, init=False)
    """The views as of ``_prev``: what the next delta is taken against."""
    _prev: cp.Head | None = field(default=None, init=False)
    """The last checkpoint of the chain written (or resumed from); None: the next one is full."""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every: {self.every} is not a number of events; use 1 or more")
        self._views = ByProxy(self.travel.apply, self.travel.stream)
        self.store: CheckpointStore[V] = CheckpointStore(self.js, self.travel)
        self.lock = KvLock(
            self.js,
            bucket=CHECKPOINT_LOCK,
            key=self.travel.stream,
            ttl=self.lock_ttl,
            description="egress-proxies: which discovery replica writes checkpoints",
        )

    async def run(self) -> None:
        """Forever: wait for the lock, then write while it is held; whatever fails is logged and
        the writer starts again a little later."""
        while True:
            pause = RETRY
            try:
                async with self.lock.hold() as held:
                    if held is None:
                        self.stats.waits += 1
                        pause = self.lock.ttl / 3
                    else:
                        log.info("checkpoint writer holds the lock", stream=self.travel.stream)
                        await self.follow(held=held)
                        log.warning("checkpoint writer lost the lock", stream=self.travel.stream)
                        pause = 0.0
            except (EventStoreError, cp.Unusable, nats.errors.Error, TimeoutError) as exc:
                log.warning(
                    "checkpoints stopped, again later", stream=self.travel.stream, error=exc
                )
            except Exception:  # derived state: a bug here must not stop the API
                log.exception("checkpoints failed, again later", stream=self.travel.stream)
            raise_if_cancelled()
            await asyncio.sleep(pause)

    async def follow(self, *, until_seq: int | None = None, held: Held | None = None) -> None:
        """Resume, then fold and write; returns once ``until_seq`` is folded (None: never) or
        ``held`` is lost."""
        await self.resume()
        pull = BatchedPull(
            self.js._nc,  # the client the context was made from: nats-py keeps it there
            self.js,
            self.travel.stream,
            self.travel.filter_subject,
            batch=self.batch,
        )
        pull.last_seq = self.stats.last
        try:
            while until_seq is None or self.stats.last < until_seq:
                if held is not None and held.lost:
                    return
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
            self._base, self._prev = {}, None
        else:
            head = found.head
            self._views.views = found.views
            self._origin, self._high, self.stats.last = head.origin, head.high_us, head.seq
            self._base, self._prev = dict(found.views), head
            self.stats.unusable += found.fallbacks
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
            self._base, self._prev = {}, None
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
        snapshot = dict(self._views.views)
        label = cp.Head(
            format=cp.FORMAT,
            stream=self.travel.stream,
            tag=self.travel.tag,
            seq=seq,
            subject=subject,
            time_us=stamped,
            high_us=self._high,
            origin=self._origin,
            views=len(snapshot),
            raw=0,
            packed=0,
            chunks=0,
            digest="",
        )
        try:
            head, packed = await asyncio.to_thread(self._pack, label, snapshot)
            await self.store.write(head, packed)
        except StoreUnavailable as exc:
            # The next one is taken against the last one written: the chain stays whole.
            self.stats.failed += 1
            log.warning("checkpoint not written", stream=self.travel.stream, seq=seq, error=exc)
            return
        self._base, self._prev = snapshot, head
        self.stats.written += 1
        self.stats.fulls += head.full
        self.stats.bytes += head.packed
        self.stats.full_bytes += head.packed if head.full else 0

    def _pack(self, label: cp.Head, snapshot: dict[str, V]) -> tuple[cp.Head, cp.Packed]:
        """A delta of the last checkpoint written, or a full one when ``cp.full_due``."""
        prev = self._prev
        if prev is not None:
            changes = self.store.differ.diff(self._base, snapshot)
            packed = self.store.differ.pack(changes)
            if not cp.full_due(prev, len(packed.data)):
                head = msgspec.structs.replace(
                    label,
                    full=False,
                    entries=len(changes),
                    base_seq=prev.seq,
                    base_digest=prev.digest,
                    depth=prev.depth + 1,
                    chain_bytes=(0 if prev.full else prev.chain_bytes) + len(packed.data),
                    full_packed=prev.full_packed,
                )
                return _sized(head, packed), packed
        packed = self.store.packer.pack(snapshot)
        head = msgspec.structs.replace(label, entries=packed.views, full_packed=len(packed.data))
        return _sized(head, packed), packed


def _sized(head: cp.Head, packed: cp.Packed) -> cp.Head:
    return msgspec.structs.replace(
        head,
        raw=packed.raw,
        packed=len(packed.data),
        chunks=len(packed.chunks()),
        digest=packed.digest,
    )


async def write_checkpoints(js: JetStreamContext, every: int = EVERY) -> None:
    """The discovery service's task: a writer per stream time travel folds."""
    writers: list[CheckpointWriter[Any]] = [CheckpointWriter(js, t, every) for t in TRAVELS]
    async with asyncio.TaskGroup() as group:
        for writer in writers:
            group.create_task(writer.run(), name=f"checkpoints-{writer.travel.stream}")
