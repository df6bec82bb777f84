"""Time travel from checkpoints: a past instant costs what changed since the nearest one.

A time travel (the console's ``?at=``, ``get --at``, ``get pools --at``) folds the PROXY, LEASE
and POOL streams up to an instant. From the first event that costs about 0.1 ms per event, and
a week of leases is millions of them. So one discovery replica folds each stream once more, with
its own ordered reader and the same tolerant ``ByProxy`` fold time travel uses, and every
``every`` stream sequences stores a checkpoint labelled with that sequence, the server time of
its event and the latest time it covers (``pure.checkpoint.Head``): a full one (every view), or
a delta (only the views changed since the previous checkpoint of its chain, ``pure.delta``). A
travel to an instant takes the newest checkpoint covering nothing after it, loads its chain's
full one, applies the deltas up to it and folds only the events after it up to the instant: the
same views a replay gives, by construction (docs/decisions/0163-checkpoints-as-deltas.md).

Checkpoints are derived state, never facts. Each stream has its own KV bucket
(``natsusers.CHECKPOINT_BUCKETS``), keeping them as long as the stream keeps its events. The
writer holds a lock (``CHECKPOINT_LOCK``), writes a payload's chunks under its digest and the
head last. A reader ignores what it cannot verify (it does not decode, its label does not fit
the stream, its event is not the stream's, a link of its chain is missing or names other bytes)
and folds from the last good point of the chain, an older full one or the first event instead:
counted and logged, never raised.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from nats.js import JetStreamContext

from events.errors import StoreUnavailable
from services.runtime.eventlog.asof import MAX_EVENTS, ByProxy, read_until
from services.runtime.eventlog.checkpoint_store import (
    EVERY,
    LEASE,
    POOL,
    PROXY,
    TRAVELS,
    TRIES,
    UNUSABLE,
    Bounds,
    CheckpointStore,
    Travel,
    stream_bounds,
    unusable,
)
from services.runtime.eventlog.pure import checkpoint as cp
from services.runtime.eventlog.pure.checkpoint import Head, Unusable

__all__ = [
    "EVERY",
    "LEASE",
    "POOL",
    "PROXY",
    "TRAVELS",
    "UNUSABLE",
    "Bounds",
    "CheckpointStore",
    "Found",
    "Travel",
    "Travelled",
    "fold_at",
    "nearest",
    "stream_bounds",
]

V = TypeVar("V")


@dataclass
class Found(Generic[V]):
    """The views of the newest usable point of a chain, and what reaching them took."""

    head: Head
    views: dict[str, V]
    deltas: int = 0
    """Deltas applied after the full checkpoint."""
    fallbacks: int = 0
    """Checkpoints found unusable on the way: a newer point was wanted."""


async def nearest(store: CheckpointStore[V], bounds: Bounds, at_us: int | None) -> Found[V] | None:
    """The newest usable checkpoint covering nothing after ``at_us`` (None: the newest), and its
    views; None when there is none. A damaged delta stops the fold at the point before it, a
    damaged full one sends the reader to an older chain. Never raises: what fails is counted,
    logged and skipped."""
    stream = store.travel.stream
    try:
        if await store.open(create=False) is None:
            return None
        heads = await store.heads(bounds)
    except (StoreUnavailable, Unusable) as exc:
        unusable(stream, str(exc))
        return None
    by_seq = {head.seq: head for head in heads}
    fallbacks, tries, below = 0, 0, bounds.last + 1
    for target in cp.usable(heads, at_us=at_us, first=bounds.first, last=bounds.last):
        if target.seq >= below:
            continue
        links = cp.chain(target, by_seq)
        if not links:
            fallbacks += 1
            unusable(stream, f"sequence {target.seq}: a link of its chain is missing")
            continue
        tries += 1
        if tries > TRIES:
            break
        try:
            await store.verify(target)
        except (StoreUnavailable, Unusable) as exc:
            fallbacks += 1
            unusable(stream, f"sequence {target.seq}: {exc}")
            continue
        try:
            views = await store.load(links[0])
        except (StoreUnavailable, Unusable) as exc:
            fallbacks += 1
            unusable(stream, f"full checkpoint {links[0].seq}: {exc}")
            below = links[0].seq  # every later point of its chain needs it
            continue
        applied, why = 0, ""
        if len(links) > 1:
            try:
                applied, why = await store.apply_chain(views, links[1:])
            except StoreUnavailable as exc:
                why = str(exc)
        reached = links[applied]
        if why:
            fallbacks += 1
            unusable(stream, f"delta {links[applied + 1].seq}, folding from {reached.seq}: {why}")
        return Found(reached, views, applied, fallbacks)
    return None


@dataclass
class Travelled(Generic[V]):
    """A stream folded up to an instant, and what it took."""

    views: dict[str, V]
    read: int
    """Messages read after the checkpoint (or from the first), the one that ended the read too."""
    checkpoint: int = 0
    """The sequence of the checkpoint folded from; 0: none, a replay from the first event."""
    origin: int = 1
    """The first sequence the views hold events from."""
    deltas: int = 0
    """Delta checkpoints applied after the full one."""
    fallbacks: int = 0
    """Checkpoints found unusable on the way (also counted in ``UNUSABLE``)."""


async def fold_at(
    js: JetStreamContext, travel: Travel[V], at: datetime, *, limit: int = MAX_EVENTS
) -> Travelled[V]:
    """``travel``'s stream folded up to ``at``: from the nearest checkpoint, else from the first
    event. ``limit`` bounds the events folded after it (``TooMuchHistory`` beyond)."""
    bounds = await stream_bounds(js, travel.stream)
    views = ByProxy(travel.apply, travel.stream)
    found = await nearest(CheckpointStore(js, travel), bounds, cp.micros(at))
    if found is None:
        done = Travelled[V]({}, 0, 0, max(bounds.first, 1))
    else:
        head = found.head
        done = Travelled(found.views, 0, head.seq, head.origin, found.deltas, found.fallbacks)
        views.views = found.views
        views.newest = cp.EPOCH + timedelta(microseconds=head.time_us)
    read = await read_until(
        js,
        travel.stream,
        travel.filter_subject,
        at,
        limit=limit,
        start=done.checkpoint + 1,
        each=views.fold,
    )
    done.views, done.read = views.views, read.read
    return done
