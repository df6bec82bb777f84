"""The event store on NATS JetStream.

Appends publish with ``Nats-Expected-Last-Subject-Sequence`` scoped to the aggregate's subjects,
so two writers that folded the same state cannot both append. Reads use batched direct gets,
without creating a consumer per read: one per literal subject of the aggregate, sent at once, so
that a read costs the same in a stream of any size (docs/architecture.md, "Reads").
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from datetime import datetime
from typing import Any

import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from opentelemetry import propagate, trace

from events import codec, reading
from events.errors import ConcurrencyError, EventStoreError, NotSent, StoreUnavailable
from events.store import AppendResult, History, NewEvent, Recorded
from events.subjects import Aggregate
from services.runtime.eventlog.answers import Answers, Refused
from services.runtime.eventlog.skipped import LEDGER

WRONG_LAST_SEQUENCE = 10071
WRONG_LAST_SEQUENCE_CLUSTERED = 10164
"""What a replicated stream (a cluster, ``--replicas 3``) answers for the same refusal: "wrong
last sequence", without the sequence."""
CONFLICTS = frozenset({WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE_CLUSTERED})
_tracer = trace.get_tracer("egress_proxies.events")
log = structlog.get_logger("egress.events")


def parse_timestamp(value: str) -> datetime:
    """JetStream stamps nanoseconds; Python keeps microseconds."""
    return datetime.fromisoformat(value)


class JetStreamEventStore:
    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext | None = None,
        *,
        timeout: float = 5.0,
        attempts: int = 3,
        read_batch: int = 1000,
    ) -> None:
        self._nc = nc
        self._js = js or nc.jetstream()
        self._timeout = timeout
        self._attempts = attempts
        self._read_batch = read_batch
        self._answers = Answers(nc, timeout)

    # ---------------------------------------------------------------------------------- append

    async def append(
        self,
        aggregate: Aggregate,
        events: Sequence[NewEvent],
        expected_seq: int | None = None,
    ) -> AppendResult:
        # Every event is encoded before any is sent: one that cannot be fails the append with
        # nothing stored (tests/contract/event_store.py).
        payloads = [codec.encode(new.event) for new in events]
        seqs: list[int] = []
        duplicates = 0
        expected = expected_seq
        for new, payload in zip(events, payloads, strict=True):
            try:
                seq, duplicate = await self._publish(aggregate, new, payload, expected)
            except ConcurrencyError:
                if expected is None:
                    raise
                seq = await self._own_earlier_append(aggregate, new, expected)
                duplicate = True
            seqs.append(seq)
            duplicates += duplicate
            expected = None if expected is None else seq
        return AppendResult(seqs=seqs, duplicates=duplicates)

    async def _own_earlier_append(self, aggregate: Aggregate, new: NewEvent, expected: int) -> int:
        """After a conflict: is the event right after ``expected`` this very event, stored by an
        attempt whose acknowledgement we lost? Then the append already happened."""
        tail = await self._read_raw(aggregate, after_seq=expected, limit=1)
        if tail and tail[0].headers and tail[0].headers.get(codec.HDR_MSG_ID) == new.msg_id:
            return int(tail[0].headers["Nats-Sequence"])
        raise ConcurrencyError(str(aggregate), expected)

    async def _publish(
        self, aggregate: Aggregate, new: NewEvent, payload: bytes, expected: int | None
    ) -> tuple[int, bool]:
        subject = aggregate.subject_for(new.event)
        headers = codec.envelope_headers(new.event, new.msg_id, new.causation_id)
        if expected is not None:
            headers[codec.HDR_EXPECTED_SEQ] = str(expected)
            headers[codec.HDR_EXPECTED_SUBJECT] = aggregate.filter_subject
        span = _tracer.start_span(
            f"publish {aggregate.stream}",
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": "nats",
                "messaging.operation.type": "send",
                "messaging.destination.name": subject,
                "egress.event_type": codec.event_type(new.event),
            },
        )
        # With tracing off the span is invalid: skipping inject and the context switch saves
        # most of the tracing cost of an append (measured in docs/benchmarks.md).
        if span.get_span_context().is_valid:
            propagate.inject(headers, context=trace.set_span_in_context(span))
        scope = trace.use_span(span, end_on_exit=True) if span.is_recording() else nullcontext()
        with scope:
            last_error: Exception | None = None
            for attempt in range(self._attempts):
                if not self._nc.is_connected:
                    # nats-py would buffer the publish and send it after a reconnect, long after
                    # this writer gave up on it: an append that failed must not happen later.
                    # Before any attempt left, nothing can have been stored.
                    unsent = NotSent if attempt == 0 else StoreUnavailable
                    raise unsent(f"append to {subject}: not connected to NATS")
                try:
                    ack = await self._answers.acknowledged(subject, payload, headers)
                except (TimeoutError, nats.errors.NoRespondersError) as exc:
                    last_error = exc
                    await asyncio.sleep(0.05)
                    continue
                except nats.errors.Error as exc:
                    raise StoreUnavailable(f"append to {subject} failed: {exc}") from exc
                if ack.error is not None:
                    if ack.error.err_code in CONFLICTS:
                        span.set_attribute("egress.conflict", True)
                        raise ConcurrencyError(str(aggregate), expected or 0, ack.error.description)
                    raise EventStoreError(f"append to {subject} refused: {ack.error.described}")
                span.set_attribute("messaging.message.id", new.msg_id)
                return ack.seq, ack.duplicate
        raise StoreUnavailable(
            f"append to {subject}: no answer after {self._attempts} attempts"
        ) from last_error

    # ------------------------------------------------------------------------------------ read

    async def read(self, aggregate: Aggregate, after_seq: int = 0) -> History:
        raw = await self._read_raw(aggregate, after_seq=after_seq)
        return self._history(aggregate, raw, after_seq)

    def _history(self, aggregate: Aggregate, raw: list[Msg], after_seq: int) -> History:
        """Decode messages in stream order; ``last_seq`` is the highest sequence read, else
        ``after_seq``."""
        events: list[Recorded] = []
        skipped = 0
        last = after_seq
        for msg in raw:
            headers = msg.headers or {}
            last = int(headers["Nats-Sequence"])
            item, skip = reading.recorded(
                aggregate.stream,
                last,
                headers["Nats-Subject"],
                parse_timestamp(headers["Nats-Time-Stamp"]),
                msg.data,
                headers,
            )
            if skip is not None:
                # Left out of the events, but ``last`` keeps its sequence: the aggregate stays
                # writable (docs/architecture.md, "What survives a bad event").
                skipped += 1
                if LEDGER.note(skip):
                    log.warning("skipped an event no fold can use", **skip.fields())
                continue
            events.append(item)
        return History(events=events, last_seq=last, skipped=skipped)

    async def _read_raw(
        self,
        aggregate: Aggregate,
        *,
        after_seq: int,
        limit: int | None = None,
    ) -> list[Msg]:
        """The aggregate's messages after ``after_seq`` in stream order (the first ``limit``)."""
        if not aggregate.per_category:
            return await self._read_subject(
                aggregate.stream, aggregate.filter_subject, after_seq=after_seq, limit=limit
            )
        return await self._read_categories(aggregate, after_seq=after_seq, limit=limit)

    async def _read_subject(
        self, stream: str, subject: str, *, after_seq: int, limit: int | None = None
    ) -> list[Msg]:
        """Batched direct gets of one filter subject, page after page. With a literal subject the
        server walks that subject's own index; with a wildcard it walks the stream from
        ``after_seq``, so only the fallback of ``_read_categories`` reads a wildcard."""
        out: list[Msg] = []
        start = after_seq + 1
        while True:
            want = self._read_batch if limit is None else min(self._read_batch, limit - len(out))
            request = {"seq": start, "next_by_subj": subject, "batch": want}
            got, pending = await self._direct_get(stream, request)
            out.extend(got)
            if not got or pending == 0 or (limit is not None and len(out) >= limit):
                return out
            start = _seq(got[-1]) + 1

    async def _read_categories(
        self, aggregate: Aggregate, *, after_seq: int, limit: int | None
    ) -> list[Msg]:
        """A proxy's messages, read per literal subject and merged by sequence, as of one point
        of the stream (docs/architecture.md, "Reads").

        A wildcard read costs the server a walk over the stream from ``after_seq``; a read of a
        literal subject uses that subject's index and costs the same at any stream size. But
        separate reads are not one snapshot: an event appended between two of them could be
        missing from one subject while a later event of another subject is present, and the
        aggregate's last sequence would then hide it from the concurrency check of the next
        append. So the read first asks for the last message of every subject of the aggregate
        (``multi_last``, answered atomically with the stream's last sequence as
        ``Nats-UpTo-Sequence``): the read returns exactly the aggregate as of that sequence.
        Only the subjects with a message after ``after_seq`` there are read (a read from a kept
        state asks one or two, not every category), each until it reaches its last message
        there; one that has not (a page limit, a read served before that message was stored)
        is read again from where it stopped.
        """
        stream = aggregate.stream
        batch = self._read_batch if limit is None else min(self._read_batch, limit)
        snapshot = await self._snapshot(aggregate)
        if snapshot is None:
            return await self._read_subject(
                stream, aggregate.filter_subject, after_seq=after_seq, limit=limit
            )
        upto, lasts = snapshot
        cursors = {s: _Cursor(after_seq) for s, last in lasts.items() if last > after_seq}
        if not cursors:
            return []  # nothing stored in the aggregate after ``after_seq`` at that point
        stale = 0
        while True:
            behind = {s: c for s, c in cursors.items() if c.last < lasts.get(s, 0)}
            # Everything up to ``bound`` has been read on every subject.
            bound = min([upto, *(c.last for c in behind.values())])
            merged = sorted(
                (item for c in cursors.values() for item in c.items if item[0] <= bound),
                key=lambda item: item[0],
            )
            if not behind or (limit is not None and len(merged) >= limit):
                return [msg for _, msg in merged[:limit]]
            pages = await self._pages(stream, behind, batch)
            if any(got for got in pages):
                stale = 0
            else:
                # Every read answered from before the snapshot: in a cluster, a replica that
                # lags the one that answered ``multi_last``. Give it a moment, then read the
                # wildcard, which is one consistent prefix whatever replica answers.
                stale += 1
                if stale > _STALE_ROUNDS:
                    return await self._read_subject(
                        stream, aggregate.filter_subject, after_seq=after_seq, limit=limit
                    )
                await asyncio.sleep(0.005 * stale)
            for cursor, got in zip(behind.values(), pages, strict=True):
                cursor.add(got)

    async def _pages(
        self, stream: str, cursors: Mapping[str, _Cursor], batch: int
    ) -> list[list[Msg]]:
        """The next page of each subject after what its cursor has read, all at once."""

        async def page(subject: str, after: int) -> list[Msg]:
            request = {"seq": after + 1, "next_by_subj": subject, "batch": batch}
            got, _ = await self._direct_get(stream, request)
            return got

        return await asyncio.gather(*(page(s, c.last) for s, c in cursors.items()))

    async def _snapshot(self, aggregate: Aggregate) -> tuple[int, dict[str, int]] | None:
        """The stream's last sequence and the last sequence of each subject of the aggregate at
        that point, from one atomic ``multi_last`` direct get; ``None`` when the server cannot
        answer one (a server before 2.11, or more subjects than it lists at once)."""
        request = {"multi_last": [aggregate.filter_subject], "batch": _MULTI_LAST_MAX}
        try:
            got, pending, eob = await self._direct_get_eob(aggregate.stream, request)
        except Refused:
            return None
        if eob is None:
            return 0, {}  # 404: no subject of the aggregate holds a message
        upto = eob.get("Nats-UpTo-Sequence")
        if pending or not upto:
            return None
        return int(upto), {(m.headers or {})["Nats-Subject"]: _seq(m) for m in got}

    async def _direct_get(self, stream: str, request: dict[str, Any]) -> tuple[list[Msg], int]:
        got, pending, _ = await self._direct_get_eob(stream, request)
        return got, pending

    async def _direct_get_eob(
        self, stream: str, request: dict[str, Any]
    ) -> tuple[list[Msg], int, Mapping[str, str] | None]:
        """One direct get: the messages, how many more match, and the end-of-batch headers
        (``None`` when the server found nothing)."""
        return await self._answers.direct_get(stream, request)


_MULTI_LAST_MAX = 1024
"""The most subjects a ``multi_last`` direct get answers for (more is refused with 413)."""
_STALE_ROUNDS = 3


def _seq(msg: Msg) -> int:
    return int((msg.headers or {})["Nats-Sequence"])


class _Cursor:
    """What has been read of one subject: its messages with their sequences, and the last."""

    __slots__ = ("items", "last")

    def __init__(self, after_seq: int) -> None:
        self.items: list[tuple[int, Msg]] = []
        self.last = after_seq

    def add(self, got: list[Msg]) -> None:
        for msg in got:
            self.items.append((_seq(msg), msg))
        if got:
            self.last = self.items[-1][0]
