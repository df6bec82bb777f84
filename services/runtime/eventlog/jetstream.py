"""The event store on NATS JetStream.

Appends publish with ``Nats-Expected-Last-Subject-Sequence`` scoped to the aggregate's subjects,
so two writers that folded the same state cannot both append. Reads use batched direct gets: one
request streams every message of the aggregate back, without creating a consumer per read.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from contextlib import nullcontext
from datetime import datetime
from typing import Any

import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import APIError
from opentelemetry import propagate, trace

from events import codec, reading
from events.errors import ConcurrencyError, EventStoreError, StoreUnavailable
from events.skips import LEDGER
from events.store import AppendResult, History, NewEvent, Recorded
from events.subjects import Aggregate

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
        self._inbox = ""
        self._replies: dict[str, asyncio.Queue[Msg]] = {}
        self._next_request = 0
        self._sub_lock = asyncio.Lock()

    # ---------------------------------------------------------------------------------- append

    async def append(
        self,
        aggregate: Aggregate,
        events: Sequence[NewEvent],
        expected_seq: int | None = None,
    ) -> AppendResult:
        seqs: list[int] = []
        duplicates = 0
        expected = expected_seq
        for new in events:
            try:
                seq, duplicate = await self._publish(aggregate, new, expected)
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
        self, aggregate: Aggregate, new: NewEvent, expected: int | None
    ) -> tuple[int, bool]:
        subject = aggregate.subject_for(new.event)
        headers = codec.envelope_headers(new.event, new.msg_id, new.causation_id)
        if expected is not None:
            headers[codec.HDR_EXPECTED_SEQ] = str(expected)
            headers[codec.HDR_EXPECTED_SUBJECT] = aggregate.filter_subject
        payload = codec.encode(new.event)
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
            for _ in range(self._attempts):
                if not self._nc.is_connected:
                    # nats-py would buffer the publish and send it after a reconnect, long after
                    # this writer gave up on it: an append that failed must not happen later.
                    raise StoreUnavailable(f"append to {subject}: not connected to NATS")
                try:
                    ack = await self._js.publish(
                        subject, payload, timeout=self._timeout, headers=headers
                    )
                except APIError as exc:
                    if exc.err_code in CONFLICTS:
                        span.set_attribute("egress.conflict", True)
                        raise ConcurrencyError(
                            str(aggregate), expected or 0, exc.description or ""
                        ) from exc
                    raise EventStoreError(f"append to {subject} refused: {exc}") from exc
                except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
                    last_error = exc
                    await asyncio.sleep(0.05)
                    continue
                except nats.errors.Error as exc:
                    raise StoreUnavailable(f"append to {subject} failed: {exc}") from exc
                span.set_attribute("messaging.message.id", new.msg_id)
                return ack.seq, bool(ack.duplicate)
        raise StoreUnavailable(
            f"append to {subject}: no answer after {self._attempts} attempts"
        ) from last_error

    # ------------------------------------------------------------------------------------ read

    async def read(self, aggregate: Aggregate, after_seq: int = 0) -> History:
        raw = await self._read_raw(aggregate, after_seq=after_seq)
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
        out: list[Msg] = []
        start = after_seq + 1
        while True:
            want = self._read_batch if limit is None else min(self._read_batch, limit - len(out))
            request = {"seq": start, "next_by_subj": aggregate.filter_subject, "batch": want}
            got, pending = await self._direct_get(aggregate.stream, request)
            out.extend(got)
            if not got or pending == 0 or (limit is not None and len(out) >= limit):
                return out
            start = int((got[-1].headers or {})["Nats-Sequence"]) + 1

    async def _direct_get(self, stream: str, request: dict[str, Any]) -> tuple[list[Msg], int]:
        queue = await self._open_reply()
        token = str(self._next_request)
        self._next_request += 1
        self._replies[token] = queue
        try:
            await self._nc.publish(
                f"$JS.API.DIRECT.GET.{stream}",
                json.dumps(request).encode(),
                reply=f"{self._inbox}.{token}",
            )
            got: list[Msg] = []
            while True:
                try:
                    msg = await asyncio.wait_for(queue.get(), self._timeout)
                except TimeoutError as exc:
                    raise StoreUnavailable(f"read of {stream} timed out") from exc
                headers = msg.headers or {}
                status = headers.get("Status")
                if status is None:
                    got.append(msg)
                    continue
                if status == "204":
                    return got, int(headers.get("Nats-Num-Pending", "0"))
                if status == "404":
                    return got, 0
                if status == "503":
                    # "No responders": nothing serves direct gets for this stream. Most often
                    # it does not exist yet; in a cluster, its leader may be moving.
                    raise StoreUnavailable(
                        f"stream {stream} does not answer reads: create it with "
                        "`egress-proxies streams init` (or wait for its cluster to elect a leader)"
                    )
                description = headers.get("Description", "").strip()
                raise StoreUnavailable(f"read of {stream} failed: {status} {description}".strip())
        finally:
            self._replies.pop(token, None)

    async def _open_reply(self) -> asyncio.Queue[Msg]:
        async with self._sub_lock:
            if not self._inbox:
                self._inbox = self._nc.new_inbox()
                await self._nc.subscribe(f"{self._inbox}.*", cb=self._route)
        return asyncio.Queue()

    async def _route(self, msg: Msg) -> None:
        queue = self._replies.get(msg.subject.rsplit(".", 1)[-1])
        if queue is not None:
            queue.put_nowait(msg)
