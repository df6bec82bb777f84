"""Snapshots of a projector's views, so a replica starts from them instead of the whole stream.

A snapshot is derived state, never a fact: the events stay in the log and a rebuild from them
alone gives the same views (docs/architecture.md, "Snapshots"). The views live in a JetStream
KV bucket of the service that owns them, one key per view and one ``pass`` key:

- ``<name>.v<version>.view.<key>``: the view, complete *as of* a stream sequence: no event of
  that key up to ``as_of`` is missing from it.
- ``<name>.v<version>.pass``: the sequence of the last *complete* pass. A pass writes every view
  that changed since the writer's previous pass (and, every few passes, all of them, so that no
  view's ``as_of`` stays far behind), and only then the pass key. So every key with an event at
  or before ``pass`` has a snapshot.

A restore reads them all and starts the stream at ``min(pass, every as_of) + 1``, skipping, per
key, the events a view already holds (sequence ≤ its ``as_of``). That stays correct whatever two
writers interleave: any stored snapshot is complete as of its own ``as_of``, and a pass key is
only written after its views. ``version`` is the fold's: a fold that changes its views (or what
they mean) gets a new version, its keys are new, and the old ones are ignored (and expire).

Anything unusable (a value that does not decode, a pass beyond the stream's last sequence after
the stream was recreated) makes the restore give up: the projector then reads the whole stream,
which is always right, only slower. It is counted and logged, never raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from events.errors import StoreUnavailable

log = structlog.get_logger("egress.snapshots")

V = TypeVar("V")

DAY = 24 * 3600.0
MAX_AGE = 7 * DAY
"""Snapshots a writer stopped refreshing expire: a replica then rebuilds from the events."""
PUTS_IN_FLIGHT = 64
"""KV puts one pass keeps in flight: a pass of 10,000 views takes a fraction of a second."""


class Pass(msgspec.Struct, frozen=True):
    as_of: int
    views: int


@dataclass
class Restored(Generic[V]):
    views: dict[str, V]
    as_of: dict[str, int]
    """key -> the sequence its view is complete as of: events up to it are skipped."""
    start: int
    """The first stream sequence to read."""


@dataclass
class SnapshotStore(Generic[V]):
    js: JetStreamContext
    bucket: str
    name: str
    version: int
    view_type: type[V]
    unusable: int = 0
    _kv: KeyValue | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._view = msgspec.msgpack.Decoder(self.view_type)
        self._pass = msgspec.msgpack.Decoder(Pass)

    @property
    def prefix(self) -> str:
        return f"{self.name}.v{self.version}"

    async def open(self) -> KeyValue:
        if self._kv is not None:
            return self._kv
        try:
            try:
                kv = await self.js.key_value(self.bucket)
            except BucketNotFoundError:
                config = KeyValueConfig(
                    bucket=self.bucket,
                    history=1,
                    ttl=MAX_AGE,
                    storage=StorageType.FILE,
                    description="Snapshots of views (derived; rebuilt from the log when absent)",
                )
                kv = await self.js.create_key_value(config)
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot open the KV bucket {self.bucket}: {exc}") from exc
        self._kv = kv
        return kv

    # ------------------------------------------------------------------------------ restore

    async def restore(self, stream_last_seq: int) -> Restored[V] | None:
        """The snapshots to start from; None when there is no usable complete set."""
        try:
            await self.open()
            raw = await self._read_all()
        except (StoreUnavailable, nats.errors.Error, TimeoutError) as exc:
            log.warning("snapshots cannot be read, reading the stream", name=self.name, error=exc)
            return None
        done = raw.pop(f"{self.prefix}.pass", None)
        if done is None:
            return None
        try:
            marker = self._pass.decode(done)
        except msgspec.DecodeError:
            return self._unusable("the pass key does not decode")
        if marker.as_of > stream_last_seq:
            return self._unusable(
                f"the pass is at sequence {marker.as_of}, beyond the stream's last "
                f"({stream_last_seq}): the stream was recreated"
            )
        views: dict[str, V] = {}
        as_of: dict[str, int] = {}
        head = f"{self.prefix}.view."
        for key, value in raw.items():
            if not key.startswith(head):
                continue
            try:
                snapshot = _SNAPSHOT.decode(value)
                view = self._view.decode(snapshot.view)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                return self._unusable(f"{key} does not decode: {exc}")
            if snapshot.as_of > stream_last_seq:
                return self._unusable(f"{key} is beyond the stream's last sequence")
            views[key[len(head) :]] = view
            as_of[key[len(head) :]] = snapshot.as_of
        start = min([marker.as_of, *as_of.values()]) + 1
        return Restored(views=views, as_of=as_of, start=start)

    def _unusable(self, why: str) -> Restored[V] | None:
        """Counted and logged; None: the caller reads the whole stream."""
        self.unusable += 1
        log.warning("snapshots unusable, reading the stream", name=self.name, why=why)
        return None

    async def _read_all(self) -> dict[str, bytes]:
        """Every key of this name and version, last value only, in one ordered pull."""
        stream = f"KV_{self.bucket}"
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            filter_subject=f"$KV.{self.bucket}.{self.prefix}.>",
            inactive_threshold=60.0,
            mem_storage=True,
            num_replicas=1,
        )
        try:
            sub = await self.js.pull_subscribe(
                config.filter_subject or "", durable=None, stream=stream, config=config
            )
        except NotFoundError:
            return {}
        out: dict[str, bytes] = {}
        try:
            pending = (await sub.consumer_info()).num_pending or 0
            strip = len(f"$KV.{self.bucket}.")
            while pending > 0:
                try:
                    msgs = await sub.fetch(min(pending, 1000), timeout=1.0)
                except (nats.errors.TimeoutError, TimeoutError) as exc:
                    # A key written again meanwhile replaces the message the count included
                    # (history 1): its new value comes instead, and the count was stale. The
                    # server's count now says whether anything is really left.
                    pending = (await sub.consumer_info()).num_pending or 0
                    if pending:
                        raise StoreUnavailable(f"reading {stream} timed out") from exc
                    break
                for msg in msgs:
                    operation = (msg.headers or {}).get("KV-Operation")
                    if operation in ("DEL", "PURGE"):
                        out.pop(msg.subject[strip:], None)
                    else:
                        out[msg.subject[strip:]] = msg.data
                    pending = msg.metadata.num_pending
        finally:
            await sub.unsubscribe()
        return out

    # -------------------------------------------------------------------------------- write

    async def write(self, views: Iterable[tuple[str, V]], as_of: int) -> int:
        """One pass: every given view as of ``as_of``, then the pass key. Returns how many."""
        kv = await self.open()
        queue = [
            (
                f"{self.prefix}.view.{key}",
                self._encoder.encode(_Snapshot(as_of, msgspec.Raw(self._encoder.encode(view)))),
            )
            for key, view in views
        ]
        written = 0
        try:
            for start in range(0, len(queue), PUTS_IN_FLIGHT):
                chunk = queue[start : start + PUTS_IN_FLIGHT]
                await asyncio.gather(*(kv.put(key, value) for key, value in chunk))
                written += len(chunk)
            await kv.put(f"{self.prefix}.pass", self._encoder.encode(Pass(as_of, written)))
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot write snapshots to {self.bucket}: {exc}") from exc
        return written

    # ------------------------------------------------------------------ one key at a time

    async def get(self, key: str) -> tuple[V, int] | None:
        """One view and the sequence it is complete as of; None when absent or unusable."""
        kv = await self.open()
        try:
            entry = await kv.get(f"{self.prefix}.view.{key}")
        except nats.js.errors.KeyNotFoundError:
            return None
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot read a snapshot from {self.bucket}: {exc}") from exc
        try:
            snapshot = _SNAPSHOT.decode(entry.value or b"")
            return self._view.decode(snapshot.view), snapshot.as_of
        except (msgspec.DecodeError, msgspec.ValidationError):
            self._unusable(f"{key} does not decode")
            return None

    async def put(self, key: str, view: V, as_of: int) -> None:
        kv = await self.open()
        value = self._encoder.encode(_Snapshot(as_of, msgspec.Raw(self._encoder.encode(view))))
        try:
            await kv.put(f"{self.prefix}.view.{key}", value)
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot write a snapshot to {self.bucket}: {exc}") from exc


class _Snapshot(msgspec.Struct, frozen=True, array_like=True):
    as_of: int
    view: msgspec.Raw


_SNAPSHOT = msgspec.msgpack.Decoder(_Snapshot)


class Views(Protocol[V]):
    """What a ``Snapshotter`` needs of a projector."""

    @property
    def last_seq(self) -> int: ...
    @property
    def views(self) -> dict[str, V]: ...
    @property
    def changed(self) -> set[str]: ...


@dataclass
class Snapshotter(Generic[V]):
    """Writes passes of a projector's views: the changed ones, and every ``refresh_every``-th
    pass all of them (so no view's ``as_of`` stays far behind and restores start recently)."""

    projector: Views[V]
    store: SnapshotStore[V]
    interval: float = 30.0
    refresh_every: int = 10
    passes: int = 0
    written: int = 0

    async def write_once(self) -> int:
        """One pass; what it takes is copied at once (views are immutable), so the projector
        goes on applying events while it is written."""
        views = self.projector.views
        full = self.passes % self.refresh_every == 0
        keys = set(views) if full else set(self.projector.changed)
        self.projector.changed.clear()
        as_of = self.projector.last_seq
        items = [(key, views[key]) for key in sorted(keys) if key in views]
        try:
            count = await self.store.write(items, as_of)
        except StoreUnavailable:
            self.projector.changed.update(keys)  # the pass is incomplete: take them again
            raise
        self.passes += 1
        self.written += count
        return count

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.write_once()
            except StoreUnavailable as exc:
                log.warning("snapshots not written, trying again later", error=str(exc))
