"""The console's traffic figures (``console.pure.traffic``): the ranges a page takes, records
put in the chart's intervals by their server timestamps, and the bars drawn of them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from markupsafe import escape

from events.store import Recorded
from events.traffic import TrafficRecorded, TrafficRow
from projections.traffic import Scope, Totals, fold
from services.discovery.console.history import Cost
from services.discovery.console.pure.traffic import (
    HEIGHT,
    RANGES,
    chart,
    human_bytes,
    parse_range,
    series,
)
from services.discovery.console.render import page
from services.discovery.console.traffic_pages import client_traffic, panel
from services.discovery.console.traffic_read import TrafficRead

END = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_a_page_reads_the_last_hour_by_default_or_the_last_day() -> None:
    assert parse_range("") is RANGES["hour"]
    assert parse_range("day").seconds == 86_400
    with pytest.raises(ValueError, match="not one of hour, day"):
        parse_range("week" * 100)


def test_records_land_in_their_interval_and_outside_the_range_in_none() -> None:
    got = series(END, RANGES["hour"])
    assert len(got.requests) == 60
    assert got.since == END - timedelta(hours=1)
    got.add(got.since, Totals(requests=2, bytes_up=10, bytes_down=90))
    got.add(got.since + timedelta(seconds=59.9), Totals(requests=1, bytes_down=5))
    got.add(END - timedelta(seconds=1), Totals(requests=7))
    got.add(END, Totals(requests=100))  # the range's end is not in it
    got.add(got.since - timedelta(seconds=1), Totals(requests=100))
    assert got.requests[0] == 3
    assert got.bytes[0] == 105
    assert got.requests[59] == 7
    assert sum(got.requests) == 10


def test_the_busiest_interval_fills_the_chart_and_an_empty_one_has_no_bar() -> None:
    got = series(END, RANGES["day"])
    assert len(got.requests) == 96
    got.add(got.since + timedelta(minutes=16), Totals(requests=4))
    got.add(got.since + timedelta(hours=2), Totals(requests=1))
    drawn = chart(got, "requests")
    assert [bar.height for bar in drawn.bars] == [HEIGHT, HEIGHT / 4]
    assert drawn.bars[0].x == pytest.approx(600 / 96)
    assert drawn.bars[0].title == "2026-02-28 12:15: 4 requests"
    assert drawn.peak == "4"
    assert chart(series(END, RANGES["hour"]), "bytes").bars == ()


def test_bytes_are_shown_in_binary_units() -> None:
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * 1024**3) == "3.0 GiB"
    assert human_bytes(2**53 - 1) == "8192.0 TiB"


MARKUP = '<img src=x onerror="alert(1)">'
NAME = "'\"><iframe>&"
"""A client label, lease id or proxy uid a record may carry: printable, no spaces."""


def _hostile_read() -> TrafficRead:
    event = TrafficRecorded(
        client=NAME,
        replica="gw-1",
        start=END,
        interval_seconds=10.0,
        proxy_uid=NAME,
        lease_id=NAME,
        proxy=MARKUP,
        rows=(TrafficRow(host="shop.example", requests=2, bytes_down=2048, status_2xx=2),),
    )
    got = series(END, RANGES["hour"])
    view = fold(
        [Recorded(event, 1, "traffic.h-1", END - timedelta(seconds=30))],
        Scope(since=got.since, until=END),
    )
    got.add(END - timedelta(seconds=30), view.total)
    return TrafficRead(view, got, 1, 0.001)


def test_names_from_the_log_are_escaped_on_both_pages() -> None:
    read = _hostile_read()
    assert read.view.records == 1
    client = page(
        "client.html",
        traffic=client_traffic(read, RANGES["hour"], None),
        name=NAME,
        at=None,
        action="/ui/clients/x",
        hidden=[("range", "hour")],
        at_query="",
        signed_in=False,
    )
    proxy = page(
        "proxy.html",
        title=NAME,
        proxy=None,
        row=None,
        lines=[],
        left_out=0,
        at=None,
        now=END,
        cost=Cost(0, 0.0),
        action="/ui/proxies/x",
        live_url="",
        at_query="",
        signed_in=False,
        traffic=panel(read, RANGES["hour"], None, None),
    )
    for text in (client, proxy):
        assert "<iframe>" not in text
        assert "<img" not in text
        assert str(escape(NAME)) in text
        assert "2.0 KiB down" in text or 'data-col="down" title="2048 bytes">2048<' in text
    assert str(escape(MARKUP)) in client  # the proxy's name, in the by-proxy table
    assert 'href="/ui/proxies/%27%22%3E%3Ciframe%3E%26"' in client
    assert 'href="/ui/clients/%27%22%3E%3Ciframe%3E%26"' in proxy
    assert "2 requests</title>" in client
