"""How the JetStream store publishes an append: one event, or a decision's events in one atomic
batch (docs/decisions/0165-a-decision-in-one-atomic-batch.md).

A decision of two or more events (a command and the status it moves the proxy to) was one
publish and one acknowledgement per event, each a round trip the writer waited for and a reply
it parsed. In a batch, every message but the last goes out without a reply subject and the last
commits the batch: one acknowledgement for all of them, which names the last sequence and the
count. The server stores a batch whole, its messages next to each other in the stream, or
nothing: a writer killed before its commit, or a batch refused (the first message's expected
last sequence, a msg id already stored), leaves none of it.

The server checks ``Nats-Expected-Last-Subject-Sequence`` on the batch's first message only,
against the aggregate as it was before the batch; later messages carry none. A msg id the stream
already holds refuses the whole batch: the store then appends one at a time, which tells an
earlier attempt of its own (stored, acknowledgement lost) from a conflict, as it always did.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError
from opentelemetry import propagate, trace
from opentelemetry.trace import Span

from events import codec
from events.errors import EventStoreError, NotSent, StoreUnavailable
from events.schemas import Event
from events.store import NewEvent
from events.subjects import Aggregate

WRONG_LAST_SEQUENCE = 10071
WRONG_LAST_SEQUENCE_CLUSTERED = 10164
"""What a replicated stream (a cluster, ``--replicas 3``) answers for the same refusal: "wrong
last sequence", without the sequence."""
CONFLICTS = frozenset({WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE_CLUSTERED})
BATCH_MAX = 1000
"""The most messages the server takes in one batch (its default ``max_batch_size``); an append
of more goes one event at a time."""
ATOMIC_DISABLED = 10174
"""The stream does not allow atomic batches (``allow_atomic`` off)."""
BATCH_DUPLICATE = 10201
"""A message of the batch has a msg id the stream already holds."""
NOT_TAKEN = frozenset({ATOMIC_DISABLED, BATCH_DUPLICATE})
_tracer = trace.get_tracer("egress_proxies.events")
log = structlog.get_logger("egress.events")


@dataclass(frozen=True, slots=True)
class Message:
    """One event ready to publish. An append encodes all of its events before it sends any, so
    one that cannot be encoded fails the append with nothing sent."""

    subject: str
    payload: bytes
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Conflict:
    """The server refused an append for its expected last sequence."""

    description: str


class BatchNotTaken(Exception):
    """The server refused a batch for a reason appending one event at a time resolves: the
    stream does not allow batches, or it already holds one of the msg ids."""

    def __init__(self, err_code: int) -> None:
        super().__init__(f"atomic batch not taken: {err_code}")
        self.err_code = err_code


class Publisher:
    """One store's publishes: the envelope, the trace span, the retries on a timeout."""

    def __init__(self, nc: NATS, js: JetStreamContext, *, timeout: float, attempts: int) -> None:
        self.nc = nc
        self.js = js
        self.timeout = timeout
        self.attempts = attempts
        self.atomic: dict[str, bool] = {}
        """Per stream, whether it takes atomic batches."""

    async def allows_atomic(self, stream: str) -> bool:
        """Whether ``stream`` takes atomic batches, asked once per stream: a server before 2.12
        does not know the setting and reports none; a stream it refuses a batch for is marked
        (``refused``)."""
        known = self.atomic.get(stream)
        if known is None:
            try:
                info = await self.js.stream_info(stream)
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("cannot tell whether a stream takes batches", stream=stream, error=exc)
                return False
            known = self.atomic[stream] = bool(info.config.allow_atomic)
        return known

    def refused(self, stream: str, exc: BatchNotTaken) -> None:
        if exc.err_code == ATOMIC_DISABLED:
            log.warning(
                "stream refuses atomic batches; appending one event at a time", stream=stream
            )
            self.atomic[stream] = False

    @staticmethod
    def message(aggregate: Aggregate, new: NewEvent, expected: int | None) -> Message:
        headers = codec.envelope_headers(new.event, new.msg_id, new.causation_id)
        if expected is not None:
            headers[codec.HDR_EXPECTED_SEQ] = str(expected)
            headers[codec.HDR_EXPECTED_SUBJECT] = aggregate.filter_subject
        return Message(aggregate.subject_for(new.event), codec.encode(new.event), headers)

    async def one(
        self, aggregate: Aggregate, new: NewEvent, expected: int | None
    ) -> PubAck | Conflict:
        message = self.message(aggregate, new, expected)
        with _span(aggregate, message.subject, new.event, 1) as span:
            _inject(span, message.headers)
            ack = await self._attempt(
                message.subject,
                lambda: self.js.publish(
                    message.subject, message.payload, timeout=self.timeout, headers=message.headers
                ),
                span,
            )
            if not isinstance(ack, Conflict):
                span.set_attribute("messaging.message.id", new.msg_id)
            return ack

    async def batch(
        self, aggregate: Aggregate, events: Sequence[NewEvent], expected: int | None
    ) -> tuple[list[int], Conflict | None]:
        """``events`` in one atomic batch, the first expecting ``expected``: their sequences,
        or the conflict. Raises ``BatchNotTaken`` for what one event at a time resolves."""
        messages = [
            self.message(aggregate, new, expected if i == 0 else None)
            for i, new in enumerate(events)
        ]
        with _span(aggregate, messages[0].subject, events[0].event, len(messages)) as span:
            for message in messages:
                _inject(span, message.headers)
            ack = await self._attempt(
                messages[0].subject, lambda: self._publish_batch(messages), span
            )
        if isinstance(ack, Conflict):
            return [], ack
        committed = ack.batch_size if ack.batch_size is not None else len(messages)
        if committed != len(messages):
            raise EventStoreError(
                f"append to {aggregate}: a batch of {len(messages)} committed with {committed}"
            )
        # The acknowledgement names the last; a batch's messages are stored next to each other.
        return list(range(ack.seq - committed + 1, ack.seq + 1)), None

    async def _publish_batch(self, messages: Sequence[Message]) -> PubAck:
        """A fresh batch id per attempt: one that timed out may still be open on the server, and
        a retry must not add to it. The messages before the commit are queued without a reply;
        the client writes them with the commit (``services.runtime.nats.client``)."""
        batch = uuid.uuid4().hex
        *before, commit = messages
        for position, message in enumerate(before, start=1):
            headers = {**message.headers, codec.HDR_BATCH_ID: batch}
            headers[codec.HDR_BATCH_SEQ] = str(position)
            await self.nc.publish(message.subject, message.payload, headers=headers)
        headers = {**commit.headers, codec.HDR_BATCH_ID: batch, codec.HDR_BATCH_COMMIT: "1"}
        headers[codec.HDR_BATCH_SEQ] = str(len(messages))
        return await self.js.publish(
            commit.subject, commit.payload, timeout=self.timeout, headers=headers
        )

    async def _attempt(
        self, subject: str, publish: Callable[[], Awaitable[PubAck]], span: Span
    ) -> PubAck | Conflict:
        """Publish, again on a timeout (the msg ids make a repeat harmless); a refusal for the
        expected sequence is returned, any other refusal raised."""
        last_error: Exception | None = None
        for attempt in range(self.attempts):
            if not self.nc.is_connected:
                # nats-py would buffer the publish and send it after a reconnect, long after
                # this writer gave up on it: an append that failed must not happen later.
                # Before any attempt left, nothing can have been stored.
                unsent = NotSent if attempt == 0 else StoreUnavailable
                raise unsent(f"append to {subject}: not connected to NATS")
            try:
                return await publish()
            except APIError as exc:
                if exc.err_code in CONFLICTS:
                    span.set_attribute("egress.conflict", True)
                    return Conflict(exc.description or "")
                if exc.err_code in NOT_TAKEN:
                    raise BatchNotTaken(exc.err_code) from exc
                raise EventStoreError(f"append to {subject} refused: {exc}") from exc
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
                last_error = exc
                await asyncio.sleep(0.05)
                continue
            except nats.errors.Error as exc:
                raise StoreUnavailable(f"append to {subject} failed: {exc}") from exc
        raise StoreUnavailable(
            f"append to {subject}: no answer after {self.attempts} attempts"
        ) from last_error


def _span(aggregate: Aggregate, subject: str, event: Event, count: int) -> _SpanScope:
    attributes: dict[str, str | int] = {
        "messaging.system": "nats",
        "messaging.operation.type": "send",
        "messaging.destination.name": subject,
        "egress.event_type": codec.event_type(event),
    }
    if count > 1:
        attributes["messaging.batch.message_count"] = count
    span = _tracer.start_span(
        f"publish {aggregate.stream}", kind=trace.SpanKind.PRODUCER, attributes=attributes
    )
    return _SpanScope(span)


def _inject(span: Span, headers: dict[str, str]) -> None:
    # With tracing off the span is invalid: skipping inject and the context switch saves most
    # of the tracing cost of an append (measured in docs/benchmarks.md).
    if span.get_span_context().is_valid:
        propagate.inject(headers, context=trace.set_span_in_context(span))


class _SpanScope:
    """A publish's span, current while the publish runs when it is recorded."""

    __slots__ = ("scope", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.scope: AbstractContextManager[object] = (
            trace.use_span(span, end_on_exit=True) if span.is_recording() else nullcontext()
        )

    def __enter__(self) -> Span:
        self.scope.__enter__()
        return self.span

    def __exit__(self, *exc: object) -> None:
        self.scope.__exit__(*exc)  # type: ignore[arg-type]
