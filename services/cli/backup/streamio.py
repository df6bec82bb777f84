"""The I/O of ``backup`` and ``restore``: reading the log at a cut, the stream files, the checks
of a backup directory, and JetStream's restore API (docs/operations.md, "Backup and restore").

**The cut.** The streams are read one after another, while the services append, so "each stream
as it was when it was read" would be no state the system was ever in: an event of one stream
decided on an event of another that the backup read before it was appended would be restored
without its cause. Every stream is therefore cut at one instant ``T`` of the server's clock and
keeps exactly its events stamped at or before ``T``. A service decides only on events it read,
and it reads only stored ones, so whatever an event at or before ``T`` depends on is stamped
before it: the restored log is the log as it was at ``T``. ``T`` is the time of the durable
consumers' state, read first: a message they had acknowledged by then had its handler's appends
stored before ``T``, so restoring their acknowledged floors loses no handler's effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js.api import StreamConfig

from events.errors import EventStoreError, StoreUnavailable
from events.subjects import GC_STREAM
from services.cli.backup.files import decompressed, file_digest
from services.cli.pure.backup_manifest import (
    END,
    MAGIC,
    ConsumerEntry,
    Record,
    StreamCheck,
    StreamEntry,
    check_file,
    encode_headers,
    encode_record,
    parse_rfc3339_ns,
    records_of,
    reply_timestamp_ns,
)
from services.runtime.eventlog.ordered import OrderedPull
from services.runtime.eventlog.streams import STREAMS, StreamSpec, differences
from services.runtime.nats.connection import Connection
from services.runtime.nats.users import CHECKPOINT_BUCKETS, CONSUMERS, KV_BUCKETS

API_TIMEOUT = 10.0
CHUNK = 128 * 1024
WINDOW = 8
CACHE_BUCKETS = (KV_BUCKETS["discovery"], KV_BUCKETS["reconciler"], *CHECKPOINT_BUCKETS.values())
"""Snapshots of views and states, and time-travel checkpoints (docs/architecture.md, "Snapshots"):
derived from the log, never a fact, rebuilt from the events when missing; a restore removes them
with the log they came from."""
LIVE_BUCKETS = (KV_BUCKETS["health"], KV_BUCKETS["gc"])
"""Who runs now (health replicas, the sweep lock): true only of the processes that wrote them."""
LEFT_OUT = {
    **dict.fromkeys(CACHE_BUCKETS, "a cache of views, rebuilt from the log"),
    **dict.fromkeys(LIVE_BUCKETS, "live membership and locks, renewed by running services"),
}
NOT_FOUND = 404


class ApiError(EventStoreError):
    """The JetStream API answered with an error."""

    def __init__(self, subject: str, error: dict[str, Any]) -> None:
        super().__init__(f"{subject}: {error.get('description', error)}")
        self.code = int(error.get("code", 0))
        self.err_code = int(error.get("err_code", 0))


async def api(nc: NATS, subject: str, body: bytes = b"", timeout: float = API_TIMEOUT) -> Any:
    """One JetStream API request, its JSON answer; our errors for the library's."""
    try:
        reply = await nc.request(subject, body, timeout=timeout)
    except nats.errors.NoRespondersError as exc:
        raise StoreUnavailable(f"{subject}: JetStream did not answer (is it enabled?)") from exc
    except (nats.errors.Error, TimeoutError) as exc:
        raise StoreUnavailable(
            f"{subject}: no answer within {timeout:.0f}s (this user may not be allowed it: "
            "a restore needs the admin user)"
        ) from exc
    found = json.loads(reply.data) if reply.data else {}
    if isinstance(found, dict) and isinstance(found.get("error"), dict):
        raise ApiError(subject, found["error"])
    return found


async def optional(nc: NATS, subject: str) -> Any | None:
    """An info request whose subject may not exist (None then)."""
    try:
        return await api(nc, subject)
    except ApiError as exc:
        if exc.code == NOT_FOUND:
            return None
        raise


# -- backup ------------------------------------------------------------------------------------


async def durable_floors(nc: NATS) -> tuple[dict[str, list[ConsumerEntry]], int]:
    """The services' durable consumers by stream, and the server time they were read at (0 when
    none exists yet)."""
    found: dict[str, list[ConsumerEntry]] = {}
    at = 0
    for name, stream in CONSUMERS.items():
        info = await optional(nc, f"$JS.API.CONSUMER.INFO.{stream}.{name}")
        if info is None:
            continue
        at = max(at, server_time(info))
        floor = info.get("ack_floor") or {}
        found.setdefault(stream, []).append(
            ConsumerEntry(
                name=name,
                config=info["config"],
                ack_floor_stream_seq=int(floor.get("stream_seq", 0)),
                ack_floor_consumer_seq=int(floor.get("consumer_seq", 0)),
            )
        )
    return found, at


def server_time(info: dict[str, Any]) -> int:
    """The server's clock when it answered an info request (nats-server 2.10 on)."""
    if not isinstance(info.get("ts"), str):
        raise EventStoreError(
            "this nats-server does not say its time in its answers; a backup needs nats-server "
            "2.10 or later"
        )
    return parse_rfc3339_ns(info["ts"])


async def stream_info(nc: NATS, name: str) -> dict[str, Any]:
    info = await optional(nc, f"$JS.API.STREAM.INFO.{name}")
    if info is None:
        raise EventStoreError(
            f"stream {name} does not exist on this server: nothing to back up "
            "(`egress-proxies streams info` lists them)"
        )
    found: dict[str, Any] = info
    return found


class StreamFile:
    """A stream file being written: gzip over a file that is checksummed as it is written, so
    the manifest's SHA-256 is of exactly the bytes that reached the disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._raw = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")
        self.digest = hashlib.sha256()
        self.size = 0
        self._gzip = gzip.GzipFile(filename="", fileobj=self, mode="wb", compresslevel=6, mtime=0)
        self._gzip.write(MAGIC)

    def write(self, data: bytes) -> int:
        """For the gzip layer: the compressed bytes."""
        self._raw.write(data)
        self.digest.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        self._raw.flush()

    def add(self, record: Record) -> None:
        self._gzip.write(encode_record(record))

    def close(self) -> None:
        self._gzip.write(END)
        self._gzip.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()

    def abandon(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._gzip.close()
        self._raw.close()


async def read_stream(
    conn: Connection,
    name: str,
    *,
    first_seq: int,
    last_seq: int,
    cut_ns: int,
    each: Callable[[Record], None],
) -> None:
    """Every message of ``name`` from ``first_seq`` up to the first one stamped after the cut
    (or ``last_seq``, the stream's end when it was looked at), in order."""
    if last_seq < max(first_seq, 1):
        return
    reader = OrderedPull(conn.js, name, ">", batch=1000, inactive_threshold=60.0)
    reader.last_seq = first_seq - 1
    try:
        while True:
            msgs = await reader.fetch(timeout=2.0)
            for msg in msgs:
                seq, ts = msg.metadata.sequence.stream, reply_timestamp_ns(msg.reply or "")
                if ts > cut_ns:
                    return
                each(Record(seq, ts, msg.subject, encode_headers(msg.headers), msg.data))
                if seq >= last_seq:
                    return
            if not msgs and await reader.pending() == 0:
                return  # what remained expired (LEASE and GC keep days) while it was read
    finally:
        await reader.close()


# -- checking a backup directory ----------------------------------------------------------------


def subjects_of(name: str) -> tuple[str, ...]:
    return next(spec.subjects for spec in STREAMS if spec.name == name)


def check_stream(
    directory: Path, entry: StreamEntry, cut_ns: int, seen: Callable[[int], None]
) -> StreamCheck:
    """One stream file, read whole: the manifest's size and checksum, then every record."""
    path = directory / entry.file
    check_file(entry, *file_digest(path, entry.file))
    check = StreamCheck(entry, cut_ns, subjects_of(entry.name))
    for record in records_of(decompressed(path, entry.file), entry.file):
        check.record(record)
        seen(record.seq)
    check.finish()
    return check


def records(directory: Path, entry: StreamEntry) -> Iterator[Record]:
    """The records of a file already checked, as long as it is still that file: one changed
    since is refused before its last records leave."""
    return iter(records_of(decompressed(directory / entry.file, entry.file, entry), entry.file))


# -- restoring ----------------------------------------------------------------------------------


@dataclass
class Target:
    """What the server holds before a restore."""

    streams: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Existing streams of ours (and cache buckets) by name: their info."""
    busy: list[str] = field(default_factory=list)
    """Signs that services run against the server: a restore under them is refused."""

    def holding(self) -> dict[str, int]:
        """Our streams that hold events, and how many; none when only ``GC`` does: the first
        orphan sweep of an `up` started once on a new data dir (as the restore procedure asks,
        docs/operations.md) is no log anybody would miss, and it raced the restore's refusal."""
        names = {spec.name for spec in STREAMS}
        held = {
            name: int(info["state"]["messages"])
            for name, info in self.streams.items()
            if name in names and int(info["state"]["messages"])
        }
        return held if set(held) - {GC_STREAM} else {}

    def last_seq(self, name: str) -> int:
        info = self.streams.get(name)
        return int(info["state"]["last_seq"]) if info else 0


async def _live_keys(nc: NATS, bucket: str) -> bool:
    """Whether ``bucket`` holds a key: a replica that stopped cleanly deleted its own, but the
    delete marker is a message too, and counting messages refused every restore after it."""
    try:
        kv = await nc.jetstream().key_value(bucket)
        return bool(await kv.keys())
    except nats.js.errors.NoKeysError:
        return False


async def inspect(nc: NATS) -> Target:
    """Our streams and buckets on the server, and whether anything reads them now: a consumer
    with a pull request waiting or a subscriber bound (a service's durable, a view's follower,
    an ``events --follow``), or a health replica registered."""
    target = Target()
    for name in (*(s.name for s in STREAMS), *(f"KV_{b}" for b in (*CACHE_BUCKETS, *LIVE_BUCKETS))):
        info = await optional(nc, f"$JS.API.STREAM.INFO.{name}")
        if info is not None:
            target.streams[name] = info
    for spec in STREAMS:
        if spec.name not in target.streams:
            continue
        offset = 0
        while True:
            page = await api(
                nc, f"$JS.API.CONSUMER.LIST.{spec.name}", json.dumps({"offset": offset}).encode()
            )
            consumers = page.get("consumers") or []
            for info in consumers:
                if info.get("num_waiting") or info.get("push_bound"):
                    who = info.get("name", "?")
                    target.busy.append(f"consumer {who} is reading {spec.name}")
            offset += len(consumers)
            if not consumers or offset >= int(page.get("total", 0)):
                break
    members = target.streams.get(f"KV_{KV_BUCKETS['health']}")
    held = members is not None and int(members["state"]["messages"])
    if held and await _live_keys(nc, KV_BUCKETS["health"]):
        target.busy.append("health replicas are registered")
    return target


async def clear(nc: NATS, target: Target) -> list[str]:
    """Delete what a restore replaces: our streams (with their consumers) and the caches."""
    gone = []
    for name in target.streams:
        if name.startswith("KV_") and name[3:] in LIVE_BUCKETS:
            continue
        await api(nc, f"$JS.API.STREAM.DELETE.{name}")
        gone.append(name)
    return gone


def restore_config(spec: StreamSpec, replicas: int) -> dict[str, Any]:
    """This build's settings for the stream: the services refuse any other at start-up."""
    return spec.config(replicas).as_dict()


def differences_from(spec: StreamSpec, entry: StreamEntry, replicas: int) -> list[str]:
    """How the backed-up settings differ from the ones restored (shown, not refused)."""
    have = StreamConfig.from_response(dict(entry.config))
    return [
        f"{key}: {old!r} -> {new!r}"
        for key, (old, new) in differences(have, spec.config(replicas)).items()
    ]


async def send_restore(
    nc: NATS,
    name: str,
    *,
    config: dict[str, Any],
    state: dict[str, Any],
    payload: Iterator[bytes],
    sent: Callable[[int], None],
) -> dict[str, Any]:
    """JetStream's restore: the request, then the snapshot in chunks (each answered), then an
    empty chunk, answered once the server has stored everything. Up to ``WINDOW`` chunks are on
    their way at once, so making the next ones (their checksums cost a core) overlaps with the
    server storing the last ones; they leave in order, on one connection."""
    started = await api(
        nc,
        f"$JS.API.STREAM.RESTORE.{name}",
        json.dumps({"config": config, "state": state}).encode(),
    )
    deliver = started["deliver_subject"]
    size = min(CHUNK, nc.max_payload)
    pending = bytearray()
    flying: deque[tuple[asyncio.Task[Any], int]] = deque()

    async def landed(limit: int) -> None:
        while len(flying) > limit:
            task, length = flying.popleft()
            await task
            sent(length)

    async def put(data: bytes) -> None:
        flying.append((asyncio.ensure_future(api(nc, deliver, data, timeout=60.0)), len(data)))
        await asyncio.sleep(0)  # let it publish before the next is made
        await landed(WINDOW)

    try:
        for piece in payload:
            pending += piece
            while len(pending) >= size:
                await put(bytes(pending[:size]))
                del pending[:size]
        if pending:
            await put(bytes(pending))
        await landed(0)
    finally:
        for task, _ in flying:
            task.cancel()
    done: dict[str, Any] = await api(nc, deliver, b"", timeout=600.0)
    return done
