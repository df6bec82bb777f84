"""The log as it was at an instant: a stream read in order up to a JetStream timestamp.

Time travel (the console's ``?at=``, ``get --at``, ``events --until``) folds the log up to a time
with the same pure folds the services use, into fresh views (docs/console.md). The time that
counts is the server's timestamp of each event, which the folds use too, never a local clock.
The server stamps messages as it stores them, in stream order, so the read stops at the first
message stamped after the instant.

A read from the first sequence costs what replaying the log up to then costs: every event of
the stream (or of the subject filter) to the instant is read and folded, and nothing is kept.
A fleet's time travel starts from the nearest checkpoint instead and reads only what came after
it (``services.runtime.eventlog.checkpoints``). Either way a read refuses to fold more than
``MAX_EVENTS`` events, and says so, rather than take a replica's memory and CPU for minutes.
It folds on the event loop one fetched batch at a time and checks for a cancellation between
batches (nats-py can swallow one inside a fetch), so a read whose caller went away stops after
at most one batch (docs/decisions/0095-the-console-and-the-api-bound.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Generic, TypeVar

from nats.js import JetStreamContext

from events import reading
from events.errors import EventStoreError, StoreUnavailable
from events.skips import Skip
from events.store import Recorded
from events.subjects import proxy_uid_of
from services.runtime.aio import raise_if_cancelled
from services.runtime.eventlog.ordered import OrderedPull

V = TypeVar("V")

MAX_EVENTS = 100_000
"""The most events one read folds (after the checkpoint it starts from, if any): about 10 s of
a core at the 0.1 ms per event measured (docs/console.md, "Time travel")."""
TRACEPARENT = "traceparent"
STALLS = 3
"""Empty fetches in a row, with messages still pending, after which a read gives up."""
FIRST_BATCH = 100
"""What a read up to an instant asks for first, growing fourfold a fetch up to ``batch``: the
read stops at the first message past the instant, and every message fetched after it was
delivered and parsed for nothing (a travel to just after a checkpoint read one event of a
fetched thousand)."""


class TooMuchHistory(EventStoreError):
    """The log up to the instant holds more events than one read may fold."""


@dataclass(frozen=True, slots=True)
class Stored:
    """One message as read: the event (or its ``Unreadable`` placeholder) and its trace id."""

    recorded: Recorded
    skip: Skip | None = None
    trace_id: str = ""


@dataclass(slots=True)
class AsOf:
    """What a read returned, and what it cost."""

    stream: str
    items: list[Stored] = field(default_factory=list)
    read: int = 0
    """Messages fetched, including the one past the instant that ended the read."""


def parse_instant(text: str, name: str = "at") -> datetime:
    """An ISO 8601 time; one without a zone is UTC (what the console's time control sends)."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{name}: {text[:60]!r} is not a time; use ISO 8601, e.g. 2026-03-01T14:30:00Z "
            "(a time without a zone is UTC)"
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def trace_id(headers: dict[str, str] | None) -> str:
    """The trace id of a W3C ``traceparent`` header (``00-<trace id>-<span id>-<flags>``)."""
    parts = (headers or {}).get(TRACEPARENT, "").split("-")
    if len(parts) >= 4 and len(parts[1]) == 32 and parts[1].isalnum() and parts[1] != "0" * 32:
        return parts[1].lower()
    return ""


async def read_until(
    js: JetStreamContext,
    stream: str,
    filter_subject: str,
    until: datetime | None,
    *,
    limit: int = MAX_EVENTS,
    start: int = 1,
    batch: int = 1000,
    timeout: float = 5.0,
    each: Callable[[Stored], None] | None = None,
) -> AsOf:
    """Every message of ``filter_subject`` from sequence ``start`` stamped at or before ``until``
    (None: everything stored now), in stream order. Raises ``TooMuchHistory`` past ``limit``
    messages. With ``each``, every message is handed to it and none is kept (a fold needs only
    the views); a fold from a checkpoint starts right after it."""
    out = AsOf(stream)
    kept = 0
    pull = OrderedPull(js, stream, filter_subject, batch=batch, inactive_threshold=30)
    pull.last_seq = max(start, 1) - 1
    if until is not None:
        pull.batch = min(batch, FIRST_BATCH)
    try:
        remaining = await pull.pending()
        stalls = 0
        while remaining > 0:
            msgs = await pull.fetch(timeout)
            raise_if_cancelled()
            if not msgs:
                server, _queued = await pull.pending_parts()
                stalls += 1
                if server == 0:
                    break  # what is still queued is a late status message, not an event
                if stalls >= STALLS:
                    raise StoreUnavailable(f"reading {stream} stalled after {pull.last_seq}")
                continue
            stalls = 0
            pull.batch = min(batch, pull.batch * 4)
            for msg in msgs:
                meta = msg.metadata
                out.read += 1
                if until is not None and meta.timestamp > until:
                    return out
                if kept >= limit:
                    raise TooMuchHistory(
                        f"the {stream} stream holds more than {limit} events up to that time; "
                        "a time travel folds at most that many (docs/console.md)"
                    )
                item, skip = reading.recorded(
                    stream, meta.sequence.stream, msg.subject, meta.timestamp, msg.data, msg.headers
                )
                stored = Stored(item, skip, trace_id(msg.headers))
                kept += 1
                if each is None:
                    out.items.append(stored)
                else:
                    each(stored)
            remaining = pull.num_pending
    finally:
        await pull.close()
    return out


class ByProxy(Generic[V]):
    """Views keyed by proxy uid, folded as the projector folds them (tolerantly): pass
    ``fold`` as ``read_until``'s ``each``."""

    def __init__(self, apply: Callable[[V | None, Recorded], V], stream: str) -> None:
        self.apply = apply
        self.stream = stream
        self.views: dict[str, V] = {}
        self.newest: datetime | None = None
        """The timestamp of the last event folded."""

    def fold(self, stored: Stored) -> None:
        item = stored.recorded
        key = proxy_uid_of(item.subject)
        view, _skip = reading.apply_tolerantly(self.apply, self.views.get(key), item, self.stream)
        if view is not None:
            self.views[key] = view
        self.newest = item.timestamp
