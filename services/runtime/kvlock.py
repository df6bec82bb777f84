"""One holder at a time: a lock in a NATS KV bucket with a TTL, for work that replicas must not
do twice (GC's sweep, ``services.gc.lock``; the time-travel checkpoints' writer,
``services.runtime.eventlog.checkpoint_writer``).

The lock is a key created only if absent (``kv.create``, a compare-and-set on the key's last
sequence) in a bucket whose entries expire after the TTL: a holder that dies blocks the others
for at most the TTL, with no second coordination system. A live holder refreshes the key while it
works (every third of the TTL), so work longer than the TTL keeps its lock, and releases it by
deleting the key at its own revision only, so a holder whose lock expired never removes a
successor's. A holder learns it lost the lock at its next refresh (``Held.lost``) and must stop.

The stored message's JetStream timestamp is the holder's clock (``Held.taken_at``): replicas
with skewed clocks then agree on it (docs/architecture.md, The event log).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec
import nats.errors
import structlog
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

log = structlog.get_logger("egress.lock")


def holder_id() -> str:
    """Who holds the lock, readable in ``nats kv get``: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class LockValue(msgspec.Struct, frozen=True, kw_only=True):
    holder: str


@dataclass
class Held:
    """A lock this process holds; ``revision`` moves on each refresh."""

    revision: int
    taken_at: datetime
    holder: str
    lost: bool = False


class KvLock:
    def __init__(
        self,
        js: JetStreamContext,
        *,
        bucket: str,
        key: str,
        ttl: float,
        holder: str | None = None,
        description: str = "",
    ) -> None:
        if ttl <= 0:
            raise ValueError(f"lock ttl {ttl} must be > 0 seconds")
        self.js = js
        self.ttl = ttl
        self.bucket = bucket
        self.key = key
        self.holder = holder or holder_id()
        self.description = description or f"egress-proxies: who holds {key}"
        self._kv: KeyValue | None = None

    async def kv(self) -> KeyValue:
        """The bucket, created on first use (an existing one is used as configured)."""
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(self.bucket)
            except BucketNotFoundError:
                self._kv = await self.js.create_key_value(
                    bucket=self.bucket,
                    ttl=self.ttl,
                    history=1,
                    description=self.description,
                )
        return self._kv

    async def try_acquire(self) -> Held | None:
        """The lock, or None while another holder has it."""
        kv = await self.kv()
        value = msgspec.json.encode(LockValue(holder=self.holder))
        try:
            revision = await kv.create(self.key, value)
        except KeyWrongLastSequenceError:
            return None
        return Held(revision, await self._stamp(revision), self.holder)

    async def refresh(self, held: Held) -> bool:
        """Re-write the key at our revision (restarting its TTL); False if the lock was lost."""
        kv = await self.kv()
        value = msgspec.json.encode(LockValue(holder=self.holder))
        try:
            held.revision = await kv.update(self.key, value, last=held.revision)
        except KeyWrongLastSequenceError:
            held.lost = True
            log.warning("lock lost: it expired and may be held by another replica", key=self.key)
            return False
        return True

    async def release(self, held: Held) -> None:
        if held.lost:
            return
        kv = await self.kv()
        # The TTL frees it anyway; a failed release only delays the next sweep.
        with contextlib.suppress(KeyWrongLastSequenceError, nats.errors.Error):
            await kv.delete(self.key, last=held.revision)

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[Held | None]:
        """Hold the lock for the block (None: someone else has it), refreshing it meanwhile."""
        held = await self.try_acquire()
        if held is None:
            yield None
            return
        heartbeat = asyncio.create_task(self._heartbeat(held), name=f"lock-heartbeat-{self.key}")
        try:
            yield held
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            await asyncio.shield(self.release(held))

    async def _heartbeat(self, held: Held) -> None:
        while not held.lost:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.refresh(held)
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("lock refresh failed; retrying", key=self.key, error=str(exc))

    async def _stamp(self, revision: int) -> datetime:
        """The server's timestamp of our lock entry; the local clock if it cannot be read."""
        try:
            msg = await self.js.get_msg(f"KV_{self.bucket}", seq=revision)
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("lock timestamp unreadable; using the local clock", error=str(exc))
            return datetime.now(UTC)
        return msg.time if msg.time is not None else datetime.now(UTC)
