"""The event-store API every service writes and reads through.

Two implementations honour it: JetStream (``services.runtime.eventlog.jetstream``) and an
in-memory one (``services.runtime.eventlog.memory``) for tests without a server; one contract
suite runs against both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import msgspec

from events.errors import ConcurrencyError
from events.schemas import AnyEvent, Event
from events.subjects import Aggregate


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event about to be appended, with the id that makes a retry harmless."""

    event: Event
    msg_id: str
    causation_id: str = ""


class Unreadable(msgspec.Struct, frozen=True, kw_only=True):
    """Stands in for a stored event no reader could use, so a fold still moves past it.

    Folds keyed by aggregate keep the aggregate's last sequence for optimistic concurrency: a
    view that stopped at the event before a poison message would conflict on every append for
    ever. Folding this placeholder (every fold's default case) advances the view and changes
    nothing else. It is never written: it is not an ``Event`` and not in the union.
    """

    type: str
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Recorded:
    """An event as stored: the sequence and the server's timestamp are what folds rely on."""

    event: AnyEvent | Unreadable
    seq: int
    subject: str
    timestamp: datetime
    msg_id: str = ""
    causation_id: str = ""


@dataclass(frozen=True, slots=True)
class History:
    """An aggregate as read: ``events`` holds what decoded; ``last_seq`` is the aggregate's real
    last sequence even when the newest events were skipped, so an append decided on this history
    does not conflict for ever with a poison message."""

    events: list[Recorded]
    last_seq: int
    skipped: int = 0

    def decoded(self) -> list[AnyEvent]:
        """The events alone (a read never returns placeholders, this only narrows the type)."""
        return [r.event for r in self.events if not isinstance(r.event, Unreadable)]


@dataclass(frozen=True, slots=True)
class AppendResult:
    seqs: list[int] = field(default_factory=list)
    duplicates: int = 0

    @property
    def last_seq(self) -> int:
        return self.seqs[-1] if self.seqs else 0


class EventStore(Protocol):
    async def append(
        self,
        aggregate: Aggregate,
        events: Sequence[NewEvent],
        expected_seq: int | None = None,
    ) -> AppendResult:
        """Append in order; ``expected_seq`` is the aggregate's last sequence the writer folded
        (0: the aggregate must be empty; None: no check, for facts that depend on no state).
        Raises ConcurrencyError when the aggregate moved; a retried append of events already
        stored (same msg ids) succeeds without storing them again."""
        ...

    async def read(self, aggregate: Aggregate, after_seq: int = 0) -> History:
        """Every event of the aggregate after ``after_seq``, in order, and its last sequence."""
        ...


def derive_msg_id(*parts: str) -> str:
    """A deterministic Nats-Msg-Id from the cause of an event (never from time or randomness)."""
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).hexdigest()


Decide = Callable[[History], Sequence[NewEvent] | Awaitable[Sequence[NewEvent]]]
"""What to append on an aggregate as read; a coroutine function when the writer must ask
something else first (the reconciler asks whether the proxy is leased)."""
Start = Callable[[], Awaitable[int]]
"""The sequence the writer's own state is complete as of, read before each attempt."""


async def decide_and_append(
    store: EventStore,
    aggregate: Aggregate,
    decide: Decide,
    *,
    max_attempts: int = 50,
    after: Start | None = None,
    known: History | None = None,
) -> AppendResult:
    """Fold → decide → append, re-folding on every conflict.

    A conflict means another writer got there first; the decision is remade on the newer state, so
    a decision that became unnecessary is simply not made. The attempt bound only guards against
    a bug that would otherwise spin forever.

    A writer that keeps its folded state between decisions names, with ``after``, the sequence
    that state is complete as of: each attempt reads only the events after it, and ``decide``
    folds them on from that state. The append still expects the aggregate's real last sequence.

    ``known``: what the writer already holds for the first attempt instead of a read (the
    events after its kept state, possibly none, and the aggregate's last sequence as of them).
    A conflict reads as usual.
    """
    last_error: ConcurrencyError | None = None
    for attempt in range(max_attempts):
        if attempt == 0 and known is not None:
            history = known
        else:
            start = await after() if after is not None else 0
            history = await store.read(aggregate, after_seq=start)
        new = await _decided(decide(history))
        if not new:
            return AppendResult()
        try:
            return await store.append(aggregate, new, expected_seq=history.last_seq)
        except ConcurrencyError as exc:
            last_error = exc
    assert last_error is not None
    raise last_error


async def _decided(
    decision: Sequence[NewEvent] | Awaitable[Sequence[NewEvent]],
) -> Sequence[NewEvent]:
    if isinstance(decision, Sequence):
        return decision
    return await decision
