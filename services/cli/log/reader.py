"""Reading a stream in order, decoded, for people: replay it, then optionally keep tailing.

It reads through ``OrderedPull``, like the projections: in order, nothing shown twice or
skipped, and nothing left behind on the server (the consumer is in memory, deleted on close,
and expires on its own if the reader dies). A reconnection restarts it after the last message
shown, because nats-py pull subscriptions go deaf after a server restart.

Unlike consumers and projections, it never skips what it cannot decode: an operator looking at
the log wants to see the poison message, with the reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

import structlog
from nats.aio.msg import Msg

from events import codec, reading
from events.errors import StoreUnavailable
from events.skips import UNDECODABLE
from events.store import Recorded, Unreadable
from events.subjects import (
    DEMAND_STREAM,
    LEASE_STREAM,
    POOL_STREAM,
    PROXY_STREAM,
    TRAFFIC_STREAM,
    proxy_uid_of,
)
from projections import lease as lease_fold
from projections import pool as pool_fold
from projections import pool_demand
from projections import proxy as proxy_fold
from projections import traffic as traffic_fold
from services.cli.pure.entries import UNKNOWN_TYPE, LogEntry
from services.runtime.eventlog.ordered import OrderedPull
from services.runtime.nats.connection import Connection

log = structlog.get_logger("egress.cli.reader")


def decode_entry(
    seq: int, time: datetime, subject: str, data: bytes, headers: Mapping[str, str] | None
) -> LogEntry:
    item, skip = reading.recorded("", seq, subject, time, data, headers)
    if skip is not None or isinstance(item.event, Unreadable):
        reason = skip.reason if skip is not None else UNDECODABLE
        detail = skip.detail if skip is not None else ""
        return LogEntry(seq, time, subject, UNKNOWN_TYPE, None, detail, data, reason)
    return LogEntry(seq, time, subject, codec.event_type(item.event), item.event)


FOLDS: dict[str, Callable[[Any, Recorded], Any]] = {
    PROXY_STREAM: proxy_fold.apply,
    LEASE_STREAM: lease_fold.apply,
    POOL_STREAM: pool_fold.apply,
    DEMAND_STREAM: pool_demand.apply,
    TRAFFIC_STREAM: traffic_fold.apply,
}
"""The folds every service builds its views with, per stream: an event one of them cannot apply
is one no service can use."""


class FoldCheck:
    """Folds entries of one stream by aggregate, as the services do, to tell which decoded
    events no fold can use (the fold raised on them). Streams without a fold only decode."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.apply = FOLDS.get(stream)
        self.views: dict[str, object] = {}

    def check(self, entry: LogEntry) -> LogEntry:
        """``entry``, marked ``unusable`` when the fold could not apply it."""
        if self.apply is None or entry.event is None:
            return entry
        key = proxy_uid_of(entry.subject)
        item = Recorded(
            event=entry.event, seq=entry.seq, subject=entry.subject, timestamp=entry.time
        )
        view, skip = reading.apply_tolerantly(self.apply, self.views.get(key), item, self.stream)
        if view is not None:
            self.views[key] = view
        if skip is None:
            return entry
        return replace(entry, error=skip.detail, skipped=skip.reason)


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
        start_time: datetime | None = None,
    ) -> None:
        self.conn = conn
        self.stream = stream
        self.idle_timeout = idle_timeout
        self.read_timeout = read_timeout
        self._pull = OrderedPull(
            conn.js,
            stream,
            filter_subject,
            batch=batch,
            inactive_threshold=60,
            start_time=start_time,
        )
        self._reconnects = conn.reconnects

    @property
    def last_seq(self) -> int:
        return self._pull.last_seq

    async def batches(self, *, follow: bool = False) -> AsyncIterator[list[LogEntry]]:
        """Every message in order, a batch at a time; with ``follow`` it never ends."""
        caught_up = await self._pull.pending() == 0
        while True:
            if caught_up and not follow:
                return
            if self.conn.reconnects != self._reconnects:
                self._reconnects = self.conn.reconnects
                await self._pull.restart()
            try:
                msgs = await self._pull.fetch(self.idle_timeout if caught_up else self.read_timeout)
                if not msgs and not caught_up:
                    caught_up = await self._pull.pending() == 0
                    if not caught_up and not follow:
                        raise StoreUnavailable(
                            f"reading {self.stream} stalled after sequence {self.last_seq}"
                        )
            except StoreUnavailable as exc:
                if not follow:
                    raise
                log.warning("reader cannot read yet", error=str(exc))
                await asyncio.sleep(self.idle_timeout)
                continue
            if msgs:
                caught_up = self._pull.num_pending == 0
                yield [self._entry(msg) for msg in msgs]

    async def close(self) -> None:
        await self._pull.close()

    def _entry(self, msg: Msg) -> LogEntry:
        meta = msg.metadata
        return decode_entry(
            meta.sequence.stream, meta.timestamp, msg.subject, msg.data, msg.headers
        )
