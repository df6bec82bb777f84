"""Reading a stream in order, decoded, for people: replay it, then optionally keep tailing.

The reader is an ephemeral, unacknowledged pull consumer that checks consumer sequences are
contiguous and starts over right after the last stream sequence it showed on a gap, a
reconnection or a lost consumer (the projector's "ordered consumer"): nothing is shown twice or
skipped. It leaves nothing behind: the consumer is in memory, deleted on close, and expires on
its own if the reader dies.

Unlike consumers and projections, it never skips what it cannot decode: an operator looking at
the log wants to see the poison message, with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime

import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from events import codec
from events.errors import EventStoreError, StoreUnavailable
from events.schemas import AnyEvent
from services.runtime.connection import Connection

log = structlog.get_logger("egress.cli.reader")

UNKNOWN_TYPE = "?"


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One stored message as shown: the decoded event, or why it could not be decoded."""

    seq: int
    time: datetime
    subject: str
    type: str
    event: AnyEvent | None
    error: str = ""
    payload: bytes = b""


def decode_entry(
    seq: int, time: datetime, subject: str, data: bytes, headers: Mapping[str, str] | None
) -> LogEntry:
    try:
        event = codec.decode(data, headers)
    except codec.CodecError as exc:
        return LogEntry(seq, time, subject, UNKNOWN_TYPE, None, str(exc), data)
    return LogEntry(seq, time, subject, codec.event_type(event), event)


class LogReader:
    def __init__(
        self,
        conn: Connection,
        stream: str,
        filter_subject: str,
        *,
        batch: int = 500,
        idle_timeout: float = 1.0,
        read_timeout: float = 10.0,
    ) -> None:
        self.conn = conn
        self.stream = stream
        self.filter_subject = filter_subject
        self.batch = batch
        self.idle_timeout = idle_timeout
        self.read_timeout = read_timeout
        self.last_seq = 0
        self._sub: JetStreamContext.PullSubscription | None = None
        self._consumer = ""
        self._consumer_seq = 0
        self._reconnects = conn.reconnects

    async def batches(self, *, follow: bool = False) -> AsyncIterator[list[LogEntry]]:
        """Every message in order, a batch at a time; with ``follow`` it never ends."""
        caught_up = await self._subscribe() == 0
        while True:
            if caught_up and not follow:
                return
            if self._sub is None or self.conn.reconnects != self._reconnects:
                # A lost consumer, a gap, or a reconnection (nats-py pull subscriptions go deaf
                # after a server restart): start over right after the last message shown.
                self._reconnects = self.conn.reconnects
                try:
                    await self._resubscribe()
                except StoreUnavailable as exc:
                    if not follow:
                        raise
                    log.warning("reader cannot resubscribe yet", error=str(exc))
                    await asyncio.sleep(self.idle_timeout)
                    continue
            msgs = await self._fetch(self.idle_timeout if caught_up else self.read_timeout)
            if msgs is None:
                if not caught_up and self._sub is not None:
                    caught_up = await self._pending() == 0
                    if not caught_up and not follow:
                        raise StoreUnavailable(
                            f"reading {self.stream} stalled after sequence {self.last_seq}"
                        )
                continue
            entries: list[LogEntry] = []
            for msg in msgs:
                if msg.metadata.sequence.consumer != self._consumer_seq + 1:
                    log.info("reader gap, restarting", after=self.last_seq)
                    await self.close()
                    break
                self._consumer_seq = msg.metadata.sequence.consumer
                self.last_seq = msg.metadata.sequence.stream
                entries.append(self._entry(msg))
                caught_up = msg.metadata.num_pending == 0
            if entries:
                yield entries

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is None:
            return
        with contextlib.suppress(nats.errors.Error, ValueError, TimeoutError):
            await sub.unsubscribe()
            await self.conn.js.delete_consumer(self.stream, self._consumer)

    def _entry(self, msg: Msg) -> LogEntry:
        meta = msg.metadata
        return decode_entry(
            meta.sequence.stream, meta.timestamp, msg.subject, msg.data, msg.headers
        )

    async def _fetch(self, timeout: float) -> list[Msg] | None:
        """A batch, or None when nothing arrived in time (or the consumer was lost)."""
        assert self._sub is not None
        try:
            return await self._sub.fetch(self.batch, timeout=timeout)
        except (nats.errors.TimeoutError, TimeoutError):
            return None
        except nats.errors.Error as exc:
            log.warning("reader fetch failed, resubscribing", error=str(exc))
            await self.close()
            await asyncio.sleep(0.2)
            return None

    async def _pending(self) -> int:
        """What the consumer still has: a timed-out fetch may mean "nothing left" (messages aged
        out since the count was taken) or "slow server"; only the count tells them apart."""
        assert self._sub is not None
        try:
            return (await self._sub.consumer_info()).num_pending or 0
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"reading {self.stream}: {exc}") from exc

    async def _resubscribe(self) -> None:
        await self.close()
        await self._subscribe()

    async def _subscribe(self) -> int:
        """Start a consumer right after the last message shown; returns how many are waiting."""
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.last_seq + 1,
            filter_subject=self.filter_subject,
            inactive_threshold=60.0,
            mem_storage=True,
            num_replicas=1,
        )
        self._consumer_seq = 0
        try:
            self._sub = await self.conn.js.pull_subscribe(
                self.filter_subject, durable=None, stream=self.stream, config=config
            )
            info = await self._sub.consumer_info()
        except NotFoundError as exc:
            raise EventStoreError(
                f"stream {self.stream} does not exist: create it with `egress-proxies streams init`"
            ) from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot read {self.stream}: {exc}") from exc
        self._consumer = info.name
        return info.num_pending or 0
