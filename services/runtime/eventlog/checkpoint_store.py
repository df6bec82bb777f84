"""Checkpoints in their KV buckets: the streams time travel folds (``Travel``), and one stream's
checkpoints written, listed, verified and read (``CheckpointStore``). What a reader does with
them, the nearest usable point and the fold from it, is ``checkpoints.py``; why, and the format,
docs/decisions/0163-checkpoints-as-deltas.md and 0167-checkpoints-compact-and-chained.md.
"""

from __future__ import annotations

import asyncio
import functools
import gc
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import nats.errors
import structlog
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, KeyValueConfig, StorageType
from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from events import subjects
from events.errors import EventStoreError, StoreUnavailable
from events.store import Recorded
from projections import lease as lease_fold
from projections import pool as pool_fold
from projections import proxy as proxy_fold
from projections import versions
from projections.lease import LeaseView
from projections.pool import PoolView
from projections.proxy import ProxyView
from services.runtime.eventlog.pure import checkpoint as cp
from services.runtime.eventlog.pure import delta
from services.runtime.eventlog.pure.checkpoint import Head, Unusable
from services.runtime.eventlog.streams import STREAMS
from services.runtime.nats.users import CHECKPOINT_BUCKETS

log = structlog.get_logger("egress.checkpoints")

V = TypeVar("V")

EVERY = 2_000
"""Stream sequences between checkpoints: a travel folds at most this many events after one (about
0.15 s of a core), after decoding a full one and at most ``cp.FULL_RATIO`` of its bytes in
deltas (docs/decisions/0163-checkpoints-as-deltas.md)."""
TRIES = 3
"""Full checkpoints a reader tries, newest first, before it replays from the first event."""
MAX_HEADS = 20_000
"""Heads a reader lists at most: 200 million events of a stream at ``EVERY``."""
IN_FLIGHT = 8
HEADROOM = 4096
"""What a KV value may hold beyond a chunk: the server counts the headers of a ``create`` too."""
UNUSABLE: Counter[str] = Counter()
"""Per stream, checkpoints a reader or writer found unusable since the process started."""


@dataclass(frozen=True)
class Travel(Generic[V]):
    """One stream as time travel folds it."""

    stream: str
    filter_subject: str
    apply: Callable[[V | None, Recorded], V]
    view_type: type[V]
    version: int

    @property
    def bucket(self) -> str:
        return CHECKPOINT_BUCKETS[self.stream]

    @functools.cached_property
    def tag(self) -> str:
        return cp.tag_of(self.version, self.view_type)

    @property
    def max_age(self) -> float:
        return next(spec.max_age for spec in STREAMS if spec.name == self.stream)


PROXY: Travel[ProxyView] = Travel(
    subjects.PROXY_STREAM, "proxy.*.*", proxy_fold.apply, ProxyView, versions.PROXY
)
LEASE: Travel[LeaseView] = Travel(
    subjects.LEASE_STREAM, "lease.*", lease_fold.apply, LeaseView, versions.LEASE
)
POOL: Travel[PoolView] = Travel(
    subjects.POOL_STREAM, "pool.*.*", pool_fold.apply, PoolView, versions.POOL
)
TRAVELS: tuple[Travel[Any], ...] = (PROXY, LEASE, POOL)


@dataclass(frozen=True)
class Bounds:
    first: int
    last: int


async def stream_bounds(js: JetStreamContext, stream: str) -> Bounds:
    try:
        info = await js.stream_info(stream)
    except NotFoundError as exc:
        raise EventStoreError(
            f"stream {stream} does not exist: create it with `egress-proxies streams init`"
        ) from exc
    except (nats.errors.Error, TimeoutError) as exc:
        raise StoreUnavailable(f"cannot read the state of {stream}: {exc}") from exc
    return Bounds(int(info.state.first_seq or 0), int(info.state.last_seq or 0))


def unusable(stream: str, why: str) -> None:
    UNUSABLE[stream] += 1
    log.warning("checkpoint unusable, trying an older one or the events", stream=stream, why=why)


class CheckpointStore(Generic[V]):
    """One stream's checkpoints in its KV bucket."""

    def __init__(self, js: JetStreamContext, travel: Travel[V]) -> None:
        self.js = js
        self.travel = travel
        self._kv: KeyValue | None = None
        self._unpacker = cp.Unpacker(travel.view_type)
        self.packer = cp.Packer(travel.view_type)
        self.differ = delta.Differ(travel.view_type)

    async def open(self, *, create: bool) -> KeyValue | None:
        """The bucket; None when it does not exist and ``create`` is false (a reader)."""
        if self._kv is not None:
            return self._kv
        bucket = self.travel.bucket
        try:
            try:
                self._kv = await self.js.key_value(bucket)
            except BucketNotFoundError:
                if not create:
                    return None
                config = KeyValueConfig(
                    bucket=bucket,
                    history=1,
                    ttl=self.travel.max_age or None,
                    storage=StorageType.FILE,
                    max_value_size=cp.CHUNK + HEADROOM,
                    # Reads as direct gets: the payload as it is stored, where a stream-message
                    # get answers base64 in JSON (decoding it was a tenth of a travel's CPU).
                    direct=True,
                    description=f"Time-travel checkpoints of {self.travel.stream} (derived)",
                )
                self._kv = await self.js.create_key_value(config)
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot open the KV bucket {bucket}: {exc}") from exc
        return self._kv

    async def heads(self, bounds: Bounds) -> list[Head]:
        """Every head of this fold's tag that fits the stream, in no order."""
        bucket = self.travel.bucket
        filter_subject = f"$KV.{bucket}.{cp.heads_filter(self.travel.tag)}"
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            filter_subject=filter_subject,
            inactive_threshold=30.0,
            mem_storage=True,
            num_replicas=1,
        )
        heads: list[Head] = []
        try:
            sub = await self.js.pull_subscribe(
                filter_subject, durable=None, stream=f"KV_{bucket}", config=config
            )
            try:
                pending = int((await sub.consumer_info()).num_pending or 0)
                if pending > MAX_HEADS:
                    raise Unusable(f"{pending} heads in {bucket}, more than {MAX_HEADS}")
                while pending > 0:
                    msgs = await sub.fetch(min(pending, 500), timeout=2.0)
                    for msg in msgs:
                        pending = msg.metadata.num_pending
                        if (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
                            continue
                        head = self._head(msg.subject, msg.data, bounds)
                        if head is not None:
                            heads.append(head)
            finally:
                await sub.unsubscribe()
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot list the checkpoints in {bucket}: {exc}") from exc
        return heads

    def _head(self, subject: str, value: bytes, bounds: Bounds) -> Head | None:
        stream = self.travel.stream
        try:
            head = cp.decode_head(value)
        except Unusable as exc:
            unusable(stream, f"{subject}: {exc}")
            return None
        why = cp.fits(
            head,
            stream=stream,
            tag=self.travel.tag,
            key_seq=cp.seq_of_key(subject),
            last=bounds.last,
        )
        if why:
            unusable(stream, f"{subject}: {why}")
            return None
        return head

    async def load(self, head: Head) -> dict[str, V]:
        """The views of a full checkpoint, once its bytes check out."""
        data = await self.payload(head)
        return await asyncio.to_thread(self._unpack, head, data)

    async def apply_chain(self, views: dict[str, V], deltas: list[Head]) -> tuple[int, str]:
        """Fold the deltas of a chain, in order, into ``views`` (their first's base's): how many
        were applied, and why the next one was not ("" when all were). Their payloads are
        fetched together and applied in one thread, each all or nothing: a chain of 40 deltas
        is then a few round trips, not 40 fetches and 40 hand-offs to a thread
        (docs/decisions/0167-checkpoints-compact-and-chained.md)."""
        payloads = await self.payloads(deltas)
        return await asyncio.to_thread(self._apply_chain, views, deltas, payloads)

    def _apply_chain(
        self, views: dict[str, V], deltas: list[Head], payloads: list[bytes | str]
    ) -> tuple[int, str]:
        enabled = gc.isenabled()
        gc.disable()  # as in ``_unpack``
        try:
            for applied, (head, data) in enumerate(zip(deltas, payloads, strict=True)):
                if isinstance(data, str):
                    return applied, data
                try:
                    self.differ.apply(views, self.differ.unpack(head, data), expect=head.views)
                except Unusable as exc:
                    return applied, str(exc)
            return len(deltas), ""
        finally:
            if enabled:
                gc.enable()

    async def payloads(self, heads: list[Head]) -> list[bytes | str]:
        """Each head's payload as ``payload`` reads it, or why it could not be read; every
        chunk of them fetched ``IN_FLIGHT`` at a time across the heads."""
        kv = await self.open(create=False)
        if kv is None:
            return ["the bucket is gone"] * len(heads)
        keys = [
            (n, cp.chunk_key(head.tag, head.seq, head.digest, i))
            for n, head in enumerate(heads)
            for i in range(head.chunks)
        ]
        parts: list[list[bytes]] = [[] for _ in heads]
        failed: dict[int, str] = {}
        for start in range(0, len(keys), IN_FLIGHT * 4):
            window = keys[start : start + IN_FLIGHT * 4]
            got = await asyncio.gather(*(kv.get(key) for _n, key in window), return_exceptions=True)
            for (n, _key), entry in zip(window, got, strict=True):
                if isinstance(entry, KeyNotFoundError):
                    failed.setdefault(n, "a chunk is missing")
                elif isinstance(entry, nats.errors.Error | TimeoutError):
                    failed.setdefault(n, f"cannot read a checkpoint: {entry}")
                elif isinstance(entry, BaseException):
                    raise entry
                elif len(value := entry.value or b"") > cp.CHUNK:
                    failed.setdefault(n, f"a chunk of {len(value)} bytes (at most {cp.CHUNK})")
                else:
                    parts[n].append(value)
        return [failed.get(n) or b"".join(parts[n]) for n in range(len(heads))]

    async def payload(self, head: Head) -> bytes:
        """The stored chunks of ``head``, joined; each bounded before it is kept."""
        got = (await self.payloads([head]))[0]
        if isinstance(got, str):
            raise Unusable(got)
        return got

    def _unpack(self, head: Head, data: bytes) -> dict[str, V]:
        """Without the cyclic collector: decoding 10,000 views makes hundreds of thousands of
        objects, and the full collections they trigger took two thirds of the time (1.2 s
        against 0.4 s for 10,000 lease views). Reference counting still frees garbage."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._unpacker.unpack(head, data)
        finally:
            if enabled:
                gc.enable()

    async def verify(self, head: Head) -> None:
        """Event ``seq`` must be the one the checkpoint saw: a stream recreated (or restored
        from another log) since has other events under the same sequences."""
        try:
            msg = await self.js.get_msg(self.travel.stream, seq=head.seq)
        except NotFoundError:
            raise Unusable(f"event {head.seq} is not in the stream") from None
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot read event {head.seq}: {exc}") from exc
        stamped = cp.micros(msg.time) if msg.time is not None else -1
        if msg.subject != head.subject or abs(stamped - head.time_us) > 1000:
            raise Unusable(f"event {head.seq} is not the one the checkpoint folded")

    async def write(self, head: Head, packed: cp.Packed) -> None:
        """The chunks, then the head. Only the lock's holder writes, so what is already there under
        these keys is what a reader could not use (the writer resumed before it): replaced."""
        kv = await self.open(create=True)
        assert kv is not None
        chunks = packed.chunks()
        keys = [cp.chunk_key(head.tag, head.seq, head.digest, i) for i in range(len(chunks))]
        try:
            for start in range(0, len(keys), IN_FLIGHT):
                pairs = list(zip(keys, chunks, strict=True))[start : start + IN_FLIGHT]
                await asyncio.gather(*(kv.put(k, v) for k, v in pairs))
            await kv.put(cp.head_key(head.tag, head.seq), cp.encode_head(head))
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot write a checkpoint: {exc}") from exc
