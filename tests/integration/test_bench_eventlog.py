"""The event-log benchmark measures what it claims: every event it times is stored and read back.

Timings are never asserted here (they depend on the machine); a benchmark that silently dropped or
duplicated events would report a rate for work it did not do, and that is what these tests catch.
"""

from __future__ import annotations

import pytest
from rich.console import Console

from bench import eventlog
from events import subjects
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection

pytestmark = pytest.mark.integration


async def stored(conn: Connection) -> int:
    info = await conn.js.stream_info(subjects.PROXY_STREAM)
    return int(info.state.messages)


async def test_each_side_appends_and_reads_back_every_event(conn: Connection) -> None:
    store = JetStreamEventStore(conn.nc, conn.js)

    raw = await eventlog.append_raw(conn.js, "raw-t", events=50, uids=7, c=4)
    ours = await eventlog.append_ours(store, "ours-t", events=50, uids=7, c=4)

    assert (raw.events, raw.duplicates) == (50, 0)
    assert (ours.events, ours.duplicates, ours.conflicts) == (50, 0, 0)
    assert await stored(conn) == 100
    history = await store.read(subjects.proxy("ours-t-3"))
    assert len(history.events) == len(eventlog.plan("ours-t", 50, 7)["ours-t-3"])

    read = await eventlog.rebuild_raw(conn.js, eventlog.FILTER, expected=100)
    rebuilt = await eventlog.rebuild_ours(conn.js, eventlog.FILTER)
    assert read.events == 100
    assert (rebuilt.events, rebuilt.views) == (100, 14)


async def test_more_writers_than_aggregates_still_never_conflict(conn: Connection) -> None:
    store = JetStreamEventStore(conn.nc, conn.js)

    ours = await eventlog.append_ours(store, "few", events=30, uids=3, c=8)

    assert (ours.events, ours.conflicts) == (30, 0)
    assert await stored(conn) == 30


async def test_measure_interleaves_rounds_and_reports_every_round(conn: Connection) -> None:
    report = await eventlog.measure(conn, events=40, concurrency=3, uids=5, rounds=2)

    assert len(report.append) == len(report.rebuild) == 2
    assert all(r.events == o.events == 40 for r, o in report.append)
    assert sum(o.conflicts for _, o in report.append) == 0
    total = await stored(conn)
    assert total == 2 * 2 * 40
    assert all(r.events == o.events == total for r, o in report.rebuild)
    assert all(o.views == 2 * 2 * 5 for _, o in report.rebuild)
    rows = eventlog.render(report, Console(file=None, quiet=True))
    assert set(rows) == {"append", "rebuild"}


def test_an_incomplete_rebuild_is_reported_and_left_out_of_the_rates() -> None:
    report = eventlog.Report(events=10, concurrency=1, uids=1, rounds=2, stored=20)
    report.append = [(eventlog.Run(10, 1.0, 0.1), eventlog.Run(10, 2.0, 0.2))] * 2
    full = eventlog.Run(20, 1.0, 0.5)
    report.rebuild = [(full, full), (full, eventlog.Run(3, 0.01, 0.0))]
    console = Console(record=True, width=120)

    rows = eventlog.render(report, console)

    assert rows["rebuild"]["ours_rate"] == (20.0, 20.0, 20.0)
    assert rows["append"]["ratio"] == (0.5, 0.5, 0.5)
    assert "INCOMPLETE (raw, ours) reads of 20: [(20, 3)]" in console.export_text()
