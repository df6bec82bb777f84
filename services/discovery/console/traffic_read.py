"""The console's read of the TRAFFIC stream: one client's records, or every client's, stored
over a range, folded into totals and a chart's intervals
(docs/decisions/0159-traffic-in-the-console.md).

The read starts at the range's first record, found by a binary search on the stream's sequences
(a direct get per step, about 25 for a full stream: the server stamps records in stream order,
and limits retention only drops the oldest), and stops at the first record stored after the
range, so what it costs is the records in the range, never the week the stream keeps. It folds
at most ``MAX_RECORDS`` of them and refuses beyond (``TooMuchHistory``: the page says so and
names the CLI command that reads any range), between awaits a batch at a time, so a cancelled
read (its client left) stops within one batch, as every console read of the log does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from events.errors import EventStoreError
from events.store import Unreadable
from events.subjects import TRAFFIC_STREAM
from events.traffic import TrafficRecorded
from projections import traffic
from projections.traffic import Scope, Totals, TrafficView
from services.discovery.console.pure.traffic import Series
from services.runtime.eventlog.asof import Stored, read_until

MAX_RECORDS = 20_000
"""Records one page folds at most: an hour of some 55 leases busy every 10 s interval, or a day
of 2; about 2 s of a core at the 0.1 ms a record of a few hosts costs to decode and fold
(docs/console.md, "Traffic"). A range holding more is refused, not shown in part."""


@dataclass(frozen=True, slots=True)
class TrafficRead:
    view: TrafficView
    series: Series
    read: int
    seconds: float


async def _stamp(js: JetStreamContext, seq: int) -> datetime | None:
    try:
        msg = await js.get_msg(TRAFFIC_STREAM, seq)
    except Exception:  # deleted by hand, or aged out meanwhile: the search steps past it
        return None
    return msg.time


async def first_at(js: JetStreamContext, since: datetime) -> int:
    """The sequence of the first record stored at or after ``since`` (or past the last).

    A sequence that cannot be read counts as before ``since``: the search may then start a
    little early, and the fold's scope leaves out what it reads before the range."""
    try:
        info = await js.stream_info(TRAFFIC_STREAM)
    except NotFoundError:
        raise EventStoreError(
            f"stream {TRAFFIC_STREAM} does not exist: create it with `egress-proxies streams init`"
        ) from None
    low, high = int(info.state.first_seq or 1), int(info.state.last_seq or 0) + 1
    while low < high:
        middle = (low + high) // 2
        stamp = await _stamp(js, middle)
        if stamp is not None and stamp >= since:
            high = middle
        else:
            low = middle + 1
    return low


def _totals(event: TrafficRecorded) -> Totals:
    sums = Totals()
    for row in event.rows:
        sums.add(row)
    return sums


async def read(
    js: JetStreamContext,
    subject: str,
    scope: Scope,
    got: Series,
    *,
    limit: int = MAX_RECORDS,
) -> TrafficRead:
    """Fold the records of ``subject`` (``traffic.<key>`` or ``traffic.*``) that ``scope``
    holds; each counted record's totals go to ``got`` too. ``scope`` names both ends."""
    if scope.since is None or scope.until is None:
        raise ValueError("a console read of the traffic names both ends of its range")
    started = time.monotonic()
    view = TrafficView(scope=scope)

    def fold(stored: Stored) -> None:
        item = stored.recorded
        if isinstance(item.event, Unreadable) or not isinstance(item.event, TrafficRecorded):
            view.unusable += 1  # undecodable, or a newer writer's type
            return
        before = view.records
        traffic.apply(view, item)
        if view.records > before:
            got.add(item.timestamp, _totals(item.event))

    start = await first_at(js, scope.since)
    # read_until includes a record stamped at the end; the scope leaves it out, as `traffic` does.
    asof = await read_until(
        js, TRAFFIC_STREAM, subject, scope.until, limit=limit, start=start, each=fold
    )
    return TrafficRead(view, got, asof.read, time.monotonic() - started)
