"""The aggregate-read benchmark measures what it claims: a stream of the size asked for, holding
every proxy's 6 events, and every timed read returning them.

Timings are never asserted here (they depend on the machine): a benchmark that filled less than
it says, or timed reads that came back short, would report a cost for work it did not do, and that
is what these tests catch, with the same functions the full run uses.
"""

from __future__ import annotations

import argparse

import pytest
from rich.console import Console

from bench import scale_reads
from events import subjects
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection

pytestmark = pytest.mark.integration


async def test_fill_stores_six_events_per_proxy_over_every_category(conn: Connection) -> None:
    filled = await scale_reads.fill(conn, 60)

    assert (filled.messages, filled.proxies) == (60, 10)
    assert await scale_reads.stored(conn) == 60
    store = JetStreamEventStore(conn.nc, conn.js)
    history = await store.read(subjects.proxy(scale_reads.uid_of(3)))
    categories = [r.subject.rsplit(".", 1)[-1] for r in history.events]
    assert categories == ["declared", "cmd", "instance", "health", "status", "health"]
    # Written round by round: a proxy's events lie a round (10 messages) apart or so.
    assert history.events[-1].seq - history.events[0].seq > scale_reads.EVENTS_PER_PROXY


async def test_every_reader_reads_every_proxy_whole(conn: Connection) -> None:
    await scale_reads.fill(conn, 120)
    store = JetStreamEventStore(conn.nc, conn.js)
    for reader in scale_reads.READERS.values():
        for i in (0, 7, 19):
            aggregate = subjects.proxy(scale_reads.uid_of(i))
            got = await reader(store, aggregate)
            want = await store.read(aggregate)
            assert [r.seq for r in got.events] == [r.seq for r in want.events]
            assert got.last_seq == want.last_seq
            assert len(got.events) == scale_reads.EVENTS_PER_PROXY


async def test_a_tiny_run_reports_every_reader_at_every_size() -> None:
    reports = await scale_reads.measure([60, 120], reads=6, rounds=2, slow_reads=3)

    assert [r.size for r in reports] == [60, 120]
    for report in reports:
        assert report.fill.messages == report.size
        assert len(report.rounds) == 2
        for timed in report.rounds:
            assert sorted(t.reader for t in timed) == sorted(scale_reads.READERS)
            assert all(t.wrong == 0 for t in timed)
            assert {t.reader: t.reads for t in timed} == {"wildcard": 3, "store": 6, "subjects": 6}
        # Alternating which reader goes first.
        assert [t.reader for t in report.rounds[0]] == [t.reader for t in report.rounds[1]][::-1]
    console = Console(record=True, width=160)
    ratios = scale_reads.render(reports, console)
    assert set(ratios) == set(scale_reads.READERS)
    assert all(set(ratio) == {"p50_us", "server_cpu_us"} for ratio in ratios.values())
    text = console.export_text()
    assert "growth, 120 over 60 messages" in text
    assert "fill" in text


def test_growth_is_taken_within_each_round() -> None:
    def timed(reader: str, p50: float, cpu: float) -> scale_reads.Timed:
        return scale_reads.Timed(reader, 10, 0, p50, p50, p50, cpu, 1.0)

    fill = scale_reads.Fill(60, 10, 1.0)
    small = scale_reads.SizeReport(60, fill, rounds=[[timed("store", 100, 10)]] * 2)
    large = scale_reads.SizeReport(
        120, fill, rounds=[[timed("store", 120, 30)], [timed("store", 300, 10)]]
    )

    ratios = scale_reads.growth([small, large])

    assert ratios == {"store": {"p50_us": (2.1, 1.2, 3.0), "server_cpu_us": (2.0, 1.0, 3.0)}}


def test_sizes_are_messages_of_at_least_one_proxy() -> None:
    assert scale_reads.sizes("10000,1_000_000") == [10_000, 1_000_000]
    with pytest.raises(argparse.ArgumentTypeError):
        scale_reads.sizes("5")
