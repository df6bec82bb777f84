"""What a lease request asks for and what it gets: the policy a replica applies to every
request (``LeasePolicy``), one request's claim as it goes into each ``LeaseAcquired`` it tries
(``Claim``), and the answers (``Granted``, ``Stored``). Plain values, shared by the modules that
acquire (``leases``), wait (``waiting``), renew (``renewal``) and release (``holders``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from events.store import derive_msg_id
from projections.cooldown import Claimant
from projections.lease import LeaseRecord, LeaseView

DEFAULT_TTL = 300.0


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    max_ttl: float = 3600.0
    cooldown: float = 10.0
    block_backoff: float = 600.0
    """The first back-off of a (proxy, target) pair a ``blocked`` report starts (``outcomes``)."""
    max_attempts: int = 16
    """Claims one request tries before answering busy: bounds the work under heavy contention."""
    view_timeout: float = 5.0
    append_timeout: float = 1.5
    """How long a write waits for the log before the answer is 503: the store's timeout."""
    deadline_margin: float = 1.0
    """Added to the append timeout to make a write's deadline: room for the time between
    reading the clock and the server's stamp, and for what the server-clock estimate misses."""

    @property
    def default_ttl(self) -> float:
        return min(DEFAULT_TTL, self.max_ttl)

    def deadline(self, server_now: datetime) -> datetime:
        return server_now + timedelta(seconds=self.append_timeout + self.deadline_margin)

    def grant_ttl(self, requested: float | None) -> float:
        """The TTL granted: the default when none is asked for, never above the maximum. A
        longer request is clamped, not refused: the holder gets the longest lease it may have
        and learns so from ``ttlClamped``, where a refusal would only make it ask again."""
        if requested is None:
            return self.default_ttl
        return min(requested, self.max_ttl)


@dataclass(frozen=True, slots=True)
class Claim:
    """What one acquire request asks for, as it goes into each ``LeaseAcquired`` it tries."""

    selector: dict[str, str]
    ttl: float
    requested_ttl: float
    holder: str
    key: str = ""
    """The request's Idempotency-Key ("" without one)."""
    target: str = ""
    """The host the holder means to reach (a ``target_key``): proxies in back-off for it are
    skipped, and the fold refuses a claim on one."""
    client: str = ""
    """The API client asking ("" when the API has no clients). Keys are the client's own: the
    same key sent by two clients names two leases, so one cannot fetch the other's by it."""

    @property
    def claimant(self) -> Claimant:
        """Who asks: a proxy resting after this claimant's own lease is free to it (D153)."""
        return Claimant(client=self.client, holder=self.holder)

    @property
    def _keyed(self) -> tuple[str, ...]:
        return (self.client, self.key) if self.client else (self.key,)

    @property
    def lease_id(self) -> str:
        """With a key, one lease id for every attempt and every retry: derived from the key."""
        return str(uuid.UUID(derive_msg_id("lease-key", *self._keyed))) if self.key else ""

    def msg_id(self, lease_id: str, used: int) -> str:
        """With a key, the ``used``-th msg id of the key: a retry sends the same ids in the same
        order, so JetStream's stream-wide de-duplication points it at what the first request
        stored, on whichever proxy that was."""
        if self.key:
            return derive_msg_id("lease-acquired", "key", *self._keyed, str(used))
        return derive_msg_id("lease-acquired", lease_id)

    def same_request(self, record: LeaseRecord) -> bool:
        return (record.selector, record.holder, record.requested_ttl_seconds, record.client) == (
            self.selector,
            self.holder,
            self.requested_ttl,
            self.client,
        )


@dataclass(frozen=True, slots=True)
class Granted:
    view: LeaseView
    record: LeaseRecord


@dataclass(frozen=True, slots=True)
class Stored:
    """A claim the log took: at ``seq``, or, as a duplicate, what an earlier one stored there."""

    lease_id: str
    seq: int
    duplicate: bool
