"""Which health replica probes which proxy: membership in a NATS KV bucket, rendezvous hashing.

Why NATS and not a second coordination system: the fleet already depends on JetStream, and a KV
bucket whose entries expire (the bucket's TTL, a few heartbeats) is a lease table. Each replica
puts ``members.<replica-id>`` every heartbeat; a replica that stops (``kill -9``, partition) stops
renewing, its key ages out, and the others stop counting it. A clean stop deletes the key, so
its share moves at once.

Why rendezvous hashing: every replica computes the owner of every proxy from the same sorted member
list with no further coordination, and a member joining or leaving moves only that member's
share. During the heartbeat or two in which replicas disagree about the member list, a proxy may be
probed twice or skipped once; both are harmless, because a verdict is appended with optimistic
concurrency on the proxy's last sequence and a deterministic id, so it is recorded once.

A replica that cannot renew its own key (NATS away) stops owning anything after the TTL: the
others will have taken its share over by then.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import socket
import uuid
from collections.abc import Sequence

import nats.errors
import structlog
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError, NotFoundError
from nats.js.kv import KeyValue

from services.runtime.aio import raise_if_cancelled

log = structlog.get_logger("egress.health.assign")

BUCKET = "egress-health-members"
PREFIX = "members."
TTL_HEARTBEATS = 3
"""The bucket's TTL in heartbeats: one lost heartbeat never evicts a live replica."""
_KEY_UNSAFE = re.compile(r"[^-_=A-Za-z0-9]")


def default_replica_id() -> str:
    """Host, pid and a random part: unique per process even across restarts with a reused pid."""
    raw = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return _KEY_UNSAFE.sub("_", raw)


def _score(member: str, key: str) -> int:
    digest = hashlib.blake2b(f"{member}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(key: str, members: Sequence[str]) -> str | None:
    """The member with the highest hash of (member, key); None without members."""
    if not members:
        return None
    return max(members, key=lambda member: (_score(member, key), member))


MAX_OWNED = 2_000_000
"""Keys ``owns`` remembers before it forgets them all (about 200 MB at most)."""


class Membership:
    """This replica's heartbeat and its view of the live members."""

    def __init__(
        self,
        js: JetStreamContext,
        replica_id: str,
        *,
        heartbeat: float = 1.0,
        bucket: str = BUCKET,
    ) -> None:
        if _KEY_UNSAFE.search(replica_id):
            raise ValueError(f"replica id {replica_id!r}: use letters, digits, '-', '_' or '='")
        self.js = js
        self.replica_id = replica_id
        self.heartbeat = heartbeat
        self.ttl = heartbeat * TTL_HEARTBEATS
        self.bucket = bucket
        self.members: tuple[str, ...] = ()
        self.generation = 0
        """Bumped whenever ``members`` changes, so callers can cache assignments."""
        self._kv: KeyValue | None = None
        self._renewed_at = float("-inf")
        self._owned: dict[str, bool] = {}
        """``owns`` per key for the current ``members``: the prober asks for every Ready proxy
        each second, and a rendezvous hash per proxy per second was a third of a core at 10^5."""

    async def join(self) -> None:
        self._kv = await self._open()
        await self.beat()

    async def _open(self) -> KeyValue:
        try:
            kv = await self.js.key_value(self.bucket)
        except NotFoundError:
            pass
        else:
            return kv
        try:
            return await self.js.create_key_value(
                bucket=self.bucket, ttl=self.ttl, history=1, description="Live health replicas"
            )
        except BadRequestError:
            # Another replica created it meanwhile (with its own heartbeat): use theirs.
            return await self.js.key_value(self.bucket)

    async def run(self) -> None:
        """Heartbeat forever; a failed beat is logged and retried on the next one."""
        while True:
            await asyncio.sleep(self.heartbeat)
            try:
                await self.beat()
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("health heartbeat failed", replica=self.replica_id, error=str(exc))
                self._publish(self._alive_members(self.members))
            raise_if_cancelled()

    async def beat(self) -> None:
        kv = self._require()
        await kv.put(PREFIX + self.replica_id, b"1")
        self._renewed_at = asyncio.get_running_loop().time()
        self._publish(self._alive_members(await self._list(kv)))

    async def leave(self) -> None:
        """Hand the share over now rather than after the TTL."""
        self._renewed_at = float("-inf")
        self._publish(())
        if self._kv is not None:
            try:
                await self._kv.delete(PREFIX + self.replica_id)
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("health replica could not leave", error=str(exc))

    def owns(self, key: str) -> bool:
        found = self._owned.get(key)
        if found is None:
            if len(self._owned) >= MAX_OWNED:
                self._owned.clear()  # keys of proxies long gone: start again
            found = self._owned[key] = owner(key, self.members) == self.replica_id
        return found

    def alive(self) -> bool:
        """Whether our own key is surely still in the bucket."""
        return asyncio.get_running_loop().time() - self._renewed_at < self.ttl

    def _alive_members(self, listed: Sequence[str]) -> tuple[str, ...]:
        if not self.alive():
            return ()
        return tuple(sorted({*listed, self.replica_id}))

    def _publish(self, members: tuple[str, ...]) -> None:
        if members != self.members:
            log.info("health members changed", replica=self.replica_id, members=list(members))
            self.members = members
            self._owned.clear()
            self.generation += 1

    async def _list(self, kv: KeyValue) -> list[str]:
        """Keys with a live value: expired ones are gone from the stream, deleted ones end in a
        delete marker, which ``get`` reports as not found."""
        stream = f"KV_{self.bucket}"
        info = await self.js.stream_info(stream, subjects_filter=f"$KV.{self.bucket}.{PREFIX}>")
        names = sorted(
            subject.removeprefix(f"$KV.{self.bucket}.{PREFIX}")
            for subject in (info.state.subjects or {})
        )
        live = []
        for name in names:
            if name == self.replica_id:
                live.append(name)
                continue
            try:
                await kv.get(PREFIX + name)
            except NotFoundError:
                continue
            live.append(name)
        return live

    def _require(self) -> KeyValue:
        if self._kv is None:
            raise RuntimeError("Membership.join() first")
        return self._kv
