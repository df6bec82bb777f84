"""The subject-count benchmark does the work it reports: a stream of N proxies x 3 subjects, every
timed read finding the proxy's events, every append stored after the proxy's last event, and
each durable delivering each new message once, in order.

Timings are never asserted (they depend on the machine): a benchmark that filled less, or whose
timed operations failed or came back short, would report a cost for work it did not do.
"""

from __future__ import annotations

import argparse

import pytest
from rich.console import Console

from bench import subjects as bench
from bench import subjects_report
from events import subjects
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection

pytestmark = pytest.mark.integration


async def test_fill_writes_three_subjects_per_proxy_in_category_rounds(conn: Connection) -> None:
    filled = await bench.fill(conn, 20)

    assert (filled.proxies, filled.messages) == (20, 60)
    assert await bench.num_subjects(conn) == 60
    history = await JetStreamEventStore(conn.nc, conn.js).read(subjects.proxy(bench.uid_of(7)))
    assert [r.subject for r in history.events] == [
        f"proxy.{bench.uid_of(7)}.{category}" for category in bench.CATEGORIES
    ]
    assert [r.seq for r in history.events] == [8, 28, 48]
    assert history.last_seq == bench.last_seq(20, 7)
    # Realistic payloads, a few hundred bytes each.
    assert 150 <= filled.payload_bytes / filled.messages <= 400


async def test_appends_beyond_the_fleet_chain_each_proxys_last_sequence(conn: Connection) -> None:
    await bench.fill(conn, 20)
    first = 61
    for name in bench.FILTERS:
        await conn.js.add_consumer(bench.STREAM, bench.consumer(name, first))
    store = JetStreamEventStore(conn.nc, conn.js)

    ok = await bench.appends(store, 20, 50, seed=3)

    assert ok == 50
    assert await bench.stored(conn) == 110
    verdicts = 0
    for i in range(20):
        history = await store.read(subjects.proxy(bench.uid_of(i)))
        verdicts += sum(r.subject.endswith(".health") for r in history.events)
        assert len(history.events) >= 5  # 50 appends over 20 proxies: 2 or 3 each
    assert verdicts == 50
    for name in bench.FILTERS:
        assert await bench.consume(conn, name, 50, first) == 50


async def test_a_tiny_run_does_every_operation_it_reports() -> None:
    report = await bench.measure(300, m=400, k=120, seed=2)

    assert (report.fill.messages, report.subjects) == (900, 900)
    assert report.stored_after == 900 + 400
    assert [c.op for c in report.costs] == list(subjects_report.OPS)
    for cost in report.costs:
        assert cost.ok == cost.count, cost
    reads = dict.fromkeys(subjects_report.OPS[:6], 120)
    assert {c.op: c.count for c in report.costs} == {
        **reads,
        "append": 400,
        "one": 400,
        "four": 400,
    }
    assert min(report.rss_empty_mb, report.fill.rss_mb, report.rss_restart_mb) > 0
    assert report.rss_crash_mb > 0
    assert report.rss_after_reads_mb > 0
    assert report.rss_idle_mb > 0
    assert report.ready_s > 0
    assert report.ready_after_kill_s > 0
    console = Console(record=True, width=200)
    subjects_report.render([report], console)
    text = console.export_text()
    assert "900" in text
    assert "B/subject" in text


def test_sizes_are_whole_proxies() -> None:
    assert bench.proxy_counts("10_000,1000000") == [10_000, 1_000_000]
    for bad in ("0", "ten", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="--proxies"):
            bench.proxy_counts(bad)
