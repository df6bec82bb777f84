"""The event store on NATS JetStream.

Appends publish with ``Nats-Expected-Last-Subject-Sequence`` scoped to the aggregate's subjects,
so two writers that folded the same state cannot both append; a decision of several events goes
in one atomic batch (``publish``). Reads use batched direct gets,
without creating a consumer per read: one per literal subject of the aggregate, sent at once, so
that a read costs the same in a stream of any size (docs/architecture.md, "Reads").
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from events import codec, reading
from events.errors import ConcurrencyError, StoreUnavailable
from events.store import AppendResult, History, NewEvent, Recorded
from events.subjects import Aggregate
from services.runtime.eventlog.publish import BATCH_MAX, BatchNotTaken, Conflict, Publisher
from services.runtime.eventlog.skipped import LEDGER

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
        self._inbox = ""
        self._replies: dict[str, _Reply] = {}
        self._next_request = 0
        self._sub_lock = asyncio.Lock()
        self._publisher = Publisher(self._nc, self._js, timeout=timeout, attempts=attempts)

    # ---------------------------------------------------------------------------------- append

    async def append(
        self,
        aggregate: Aggregate,
        events: Sequence[NewEvent],
        expected_seq: int | None = None,
    ) -> AppendResult:
        """Several events in one atomic batch when the stream takes them (``publish``), else one
        publish each, each expecting the sequence the one before it got."""
        publisher = self._publisher
        if 1 < len(events) <= BATCH_MAX and await publisher.allows_atomic(aggregate.stream):
            try:
                seqs, conflict = await publisher.batch(aggregate, events, expected_seq)
            except BatchNotTaken as exc:
                publisher.refused(aggregate.stream, exc)  # one at a time tells what is stored
            else:
                if conflict is None:
                    return AppendResult(seqs=seqs)
                if expected_seq is None:
                    raise ConcurrencyError(str(aggregate), 0, conflict.description)
                # The batch's first event may be our own earlier attempt's, its acknowledgement
                # lost: then the rest goes one at a time from there.
                first = await self._own_earlier_append(aggregate, events[0], expected_seq)
                rest = await self._append_each(aggregate, events[1:], first)
                return AppendResult(seqs=[first, *rest.seqs], duplicates=rest.duplicates + 1)
        return await self._append_each(aggregate, events, expected_seq)

    async def _append_each(
        self, aggregate: Aggregate, events: Sequence[NewEvent], expected_seq: int | None
    ) -> AppendResult:
        seqs: list[int] = []
        duplicates = 0
        expected = expected_seq
        for new in events:
            ack = await self._publisher.one(aggregate, new, expected)
            if isinstance(ack, Conflict):
                if expected is None:
                    raise ConcurrencyError(str(aggregate), 0, ack.description)
                seq, duplicate = await self._own_earlier_append(aggregate, new, expected), True
            else:
                seq, duplicate = ack.seq, bool(ack.duplicate)
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
        except _Refused:
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
        reply = await self._open_reply()
        token = str(self._next_request)
        self._next_request += 1
        self._replies[token] = reply
        try:
            await self._nc.publish(
                f"$JS.API.DIRECT.GET.{stream}",
                json.dumps(request).encode(),
                reply=f"{self._inbox}.{token}",
            )
            try:
                async with asyncio.timeout(self._timeout):
                    end = await reply.end
            except TimeoutError as exc:
                raise StoreUnavailable(f"read of {stream} timed out") from exc
        finally:
            self._replies.pop(token, None)
        headers = end.headers or {}
        status = headers.get("Status")
        if status == "204":
            return reply.msgs, int(headers.get("Nats-Num-Pending", "0")), headers
        if status == "404":
            return reply.msgs, 0, None
        if status == "503":
            # "No responders": nothing serves direct gets for this stream. Most often it does not
            # exist yet; in a cluster, its leader may be moving.
            raise StoreUnavailable(
                f"stream {stream} does not answer reads: create it with "
                "`egress-proxies streams init` (or wait for its cluster to elect a leader)"
            )
        description = headers.get("Description", "").strip()
        error = _Refused if status in _REFUSED else StoreUnavailable
        raise error(f"read of {stream} failed: {status} {description}".strip())

    async def _open_reply(self) -> _Reply:
        async with self._sub_lock:
            if not self._inbox:
                self._inbox = self._nc.new_inbox()
                await self._nc.subscribe(f"{self._inbox}.*", cb=self._route)
        return _Reply()

    async def _route(self, msg: Msg) -> None:
        """Collect a reply's messages until its status message ends it: the reader wakes once
        per request, not once per message."""
        reply = self._replies.get(msg.subject.rsplit(".", 1)[-1])
        if reply is None or reply.end.done():
            return
        if msg.headers and "Status" in msg.headers:
            reply.end.set_result(msg)
        else:
            reply.msgs.append(msg)


class _Reply:
    """The answer to one direct get as it arrives: messages, then the status that ends it."""

    __slots__ = ("end", "msgs")

    def __init__(self) -> None:
        self.msgs: list[Msg] = []
        self.end: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()


_MULTI_LAST_MAX = 1024
"""The most subjects a ``multi_last`` direct get answers for (more is refused with 413)."""
_STALE_ROUNDS = 3
_REFUSED = frozenset({"408", "413"})


class _Refused(StoreUnavailable):
    """The server refused the request itself (408 bad request, 413 too many subjects)."""


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
