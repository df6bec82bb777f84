"""Traffic records (``events.traffic``) and their fold (``projections.traffic``): the codec
refuses what no fold could use, hostile records in the log are skipped and counted, and the fold
sums per client, proxy, lease and host over a time range, told as stories."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from events import codec, subjects
from events.codec import InvalidEvent
from events.pool import PoolDemand
from events.store import NewEvent, Recorded
from events.traffic import (
    MAX_BYTES,
    MAX_COUNT,
    MAX_ROWS,
    OTHER,
    TrafficRecorded,
    TrafficRow,
    client_key,
    host_problem,
    problem,
)
from projections import traffic
from projections.traffic import Scope, Totals
from services.runtime.eventlog.memory import InMemoryEventStore

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


def record(
    client: str = "crawler-a",
    proxy_uid: str = "uid-de-3",
    lease_id: str = "lease-1",
    rows: tuple[TrafficRow, ...] = (),
    **fields: Any,
) -> TrafficRecorded:
    values: dict[str, Any] = {
        "replica": "gw-1",
        "start": T0,
        "interval_seconds": 10.0,
        "proxy": "crawl/de-3",
        **fields,
    }
    return TrafficRecorded(
        client=client, proxy_uid=proxy_uid, lease_id=lease_id, rows=rows, **values
    )


def row(host: str = "shop.example", **counts: int) -> TrafficRow:
    return TrafficRow(host=host, **counts)


def stored(event: TrafficRecorded, minutes: float = 0, seq: int = 1) -> Recorded:
    return Recorded(
        event, seq, f"traffic.{client_key(event.client)}", T0 + timedelta(minutes=minutes)
    )


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "host",
    [
        "shop.example",
        "a.b-c.example",
        "10.0.0.1",
        "::1",
        "2001:db8::2",
        "xn--bcher-kva.example",
        OTHER,
    ],
)
def test_a_host_the_api_would_take_is_a_row_host(host: str) -> None:
    assert host_problem(host) is None


@pytest.mark.parametrize(
    "host",
    [
        "",
        "Shop.Example",  # stored lower case
        "xsshost<svg>.example",
        "a b.example",
        "shop.example.",
        "-shop.example",
        "shop.123",
        "999.0.0.1",
        "2001:db8::zz",
        "[::1]",
        "a" * 64 + ".example",
        ".".join(["a" * 63] * 5),
        "bücher.example",  # the IDNA form is stored
        "shop.example\x00",
    ],
)
def test_a_host_no_rule_allows_is_refused(host: str) -> None:
    assert host_problem(host) is not None


HOSTILE: list[tuple[str, TrafficRecorded]] = [
    ("negative bytes", record(rows=(row(requests=1, bytes_down=-1),))),
    ("bytes beyond exact JSON", record(rows=(row(requests=1, bytes_up=MAX_BYTES + 1),))),
    ("absurd requests", record(rows=(row(requests=MAX_COUNT + 1),))),
    ("more tunnels than requests", record(rows=(row(requests=1, tunnels=2),))),
    ("more answers than requests", record(rows=(row(requests=1, status_2xx=1, failed=1),))),
    ("a host twice", record(rows=(row(requests=1), row(requests=1)))),
    ("too many rows", record(rows=tuple(row(f"h{i}.example") for i in range(MAX_ROWS + 2)))),
    ("a bad host", record(rows=(row("evil host", requests=1),))),
    ("an empty client", record(client="")),
    ("a client with a space", record(client="crawler a")),
    ("a long lease id", record(lease_id="l" * 129)),
    ("a zero interval", record(interval_seconds=0.0)),
    ("an endless interval", record(interval_seconds=math.inf)),
    ("no interval", record(interval_seconds=math.nan)),
    ("a naive start", record(start=datetime(2026, 3, 1, 12))),
]


@pytest.mark.parametrize(("why", "event"), HOSTILE, ids=[w for w, _ in HOSTILE])
def test_the_codec_refuses_a_record_no_fold_could_use(why: str, event: TrafficRecorded) -> None:
    assert problem(event) is not None, why
    with pytest.raises(InvalidEvent):
        codec.encode(event)


@pytest.mark.parametrize(("why", "event"), HOSTILE, ids=[w for w, _ in HOSTILE])
def test_the_fold_skips_and_counts_a_hostile_record_in_the_log(
    why: str, event: TrafficRecorded
) -> None:
    good = record(rows=(row(requests=2, bytes_down=100, status_2xx=2),))
    view = traffic.fold([stored(good), stored(event, seq=2), stored(good, seq=3)])
    assert (view.unusable, view.records, view.total.bytes_down, view.last_seq) == (1, 2, 200, 3)


def test_a_record_the_gateway_writes_round_trips() -> None:
    event = record(
        rows=(
            row(requests=3, tunnels=1, bytes_up=10, bytes_down=5000, status_2xx=2, blocked=1),
            row("10.1.2.3", requests=1, failed=1),
            row(OTHER, requests=4, bytes_down=7, status_3xx=4),
        )
    )
    payload = codec.encode(event)
    assert codec.decode(payload, codec.envelope_headers(event, "m1")) == event


async def test_no_store_writes_a_refused_record() -> None:
    store = InMemoryEventStore()
    bad = record(rows=(row(requests=1, bytes_down=-5),))
    with pytest.raises(InvalidEvent):
        await store.append(subjects.traffic("crawler-a"), [NewEvent(bad, "m1")])
    assert (await store.read(subjects.traffic("crawler-a"))).events == []


def test_a_client_name_with_a_dot_gets_a_subject_token_of_its_own() -> None:
    assert client_key("crawler-a") == "crawler-a"
    dotted = client_key("crawler.a")
    assert dotted != client_key("crawler-a")
    assert "." not in dotted
    assert subjects.traffic(dotted).filter_subject == f"traffic.{dotted}"
    assert client_key("crawler.a") == dotted  # the same name, the same subject, everywhere


# ------------------------------------------------------------------ the fold, as stories

A = record(
    rows=(
        row(requests=10, bytes_up=100, bytes_down=9000, status_2xx=9, status_4xx=1, blocked=1),
        row("cdn.example", requests=5, tunnels=5, bytes_up=50, bytes_down=1000, status_2xx=5),
    )
)
"""crawler-a through de-3 on lease-1."""
B = record(
    lease_id="lease-2",
    rows=(row(requests=2, bytes_down=300, status_5xx=1, failed=1),),
)
"""crawler-a through de-3 again, a later lease."""
C = record(
    client="crawler-b",
    proxy_uid="uid-us-1",
    lease_id="lease-9",
    proxy="crawl/us-1",
    rows=(row(requests=1, bytes_down=40, status_3xx=1),),
)
"""crawler-b through us-1."""

STORIES: list[tuple[str, list[Recorded], Scope, dict[str, dict[str, int]]]] = [
    (
        "every record, per client",
        [stored(A), stored(B, 1, 2), stored(C, 2, 3)],
        Scope(),
        {"clients": {"crawler-a": 10_450, "crawler-b": 40}},
    ),
    (
        "per proxy and per lease",
        [stored(A), stored(B, 1, 2), stored(C, 2, 3)],
        Scope(),
        {
            "proxies": {"uid-de-3": 10_450, "uid-us-1": 40},
            "leases": {"lease-1": 10_150, "lease-2": 300, "lease-9": 40},
        },
    ),
    (
        "per host",
        [stored(A), stored(B, 1, 2), stored(C, 2, 3)],
        Scope(),
        {"hosts": {"shop.example": 9_440, "cdn.example": 1_050}},
    ),
    (
        "what crawler-a sent through de-3 yesterday",
        [stored(A, -24 * 60), stored(B, 1, 2), stored(C, 2, 3)],
        Scope(since=T0 - timedelta(days=1, hours=1), until=T0 - timedelta(hours=12)),
        {"clients": {"crawler-a": 9_100 + 1_050}, "leases": {"lease-1": 10_150}},
    ),
    (
        "one client only",
        [stored(A), stored(C, 2, 2)],
        Scope(client="crawler-b"),
        {"clients": {"crawler-b": 40}, "proxies": {"uid-us-1": 40}},
    ),
    (
        "one proxy, by its name",
        [stored(A), stored(C, 2, 2)],
        Scope(proxy="crawl/us-1"),
        {"proxies": {"uid-us-1": 40}},
    ),
    (
        "the range ends before the record",
        [stored(A, 5)],
        Scope(until=T0 + timedelta(minutes=5)),
        {"clients": {}},
    ),
]


@pytest.mark.parametrize(
    ("story", "records", "scope", "bytes_by"), STORIES, ids=[s[0] for s in STORIES]
)
def test_the_fold_sums_bytes_per_table(
    story: str,
    records: list[Recorded],
    scope: Scope,
    bytes_by: dict[str, dict[str, int]],
) -> None:
    view = traffic.fold(records, scope)
    for by, want in bytes_by.items():
        got = {key: sums.bytes for key, sums in traffic.table(view, by)}
        assert got == want, (story, by)


def test_the_fold_sums_every_count_and_names_the_proxies() -> None:
    view = traffic.fold([stored(A), stored(B, 1, 2), stored(C, 2, 3)])
    assert view.clients["crawler-a"] == Totals(
        requests=17,
        tunnels=5,
        bytes_up=150,
        bytes_down=10_300,
        status_2xx=14,
        status_4xx=1,
        status_5xx=1,
        blocked=1,
        failed=1,
    )
    assert view.total.requests == 18
    assert view.proxy_names == {"uid-de-3": "crawl/de-3", "uid-us-1": "crawl/us-1"}
    assert [key for key, _ in traffic.table(view, "clients")] == ["crawler-a", "crawler-b"]


def test_a_table_beyond_its_keys_sums_the_rest_as_other(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traffic, "MAX_KEYS", 2)
    events = [
        record(lease_id=f"l{i}", rows=(row(f"h{i}.example", requests=1, bytes_down=i),))
        for i in range(1, 5)
    ]
    view = traffic.fold([stored(e, i, i + 1) for i, e in enumerate(events)])
    assert {key: sums.bytes for key, sums in view.leases.items()} == {"l1": 1, "l2": 2, OTHER: 7}
    assert len(view.hosts) == 3
    assert view.total.bytes_down == 10


def test_the_fold_refuses_another_stream_s_event() -> None:
    other = Recorded(PoolDemand(uid="p", replica="r"), 1, "traffic.x", T0)
    with pytest.raises(TypeError):
        traffic.apply(None, other)
