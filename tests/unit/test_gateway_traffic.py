"""The gateway's traffic counting (``services.gateway.pure.traffic``) and its flushes
(``services.gateway.traffic``): exchanges summed per client, proxy, lease and host within the
bounds, records the codec takes whatever a crawler sends, and a failed flush appended again
under the same message ids, never twice, never without end."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from events import codec, subjects
from events.errors import StoreUnavailable
from events.store import AppendResult, NewEvent
from events.subjects import Aggregate
from events.traffic import MAX_ROWS, OTHER, TrafficRecorded, client_key, problem
from projections import traffic as fold
from services.gateway.pure import traffic
from services.gateway.pure.traffic import Backlog, Counts, Exchange, host_key
from services.gateway.traffic import TrafficRecorder, traffic_metrics
from services.runtime.eventlog.memory import InMemoryEventStore

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


def exchange(host: str = "shop.example", **fields: object) -> Exchange:
    values: dict[str, object] = {
        "client": "crawler-a",
        "proxy_uid": "uid-de-3",
        "proxy": "crawl/de-3",
        "lease_id": "lease-1",
        "host": host,
        "outcome": "success",
        "status": 200,
        "up": 10,
        "down": 1000,
        **fields,
    }
    return Exchange(**values)  # type: ignore[arg-type]


def taken(counts: Counts) -> list[TrafficRecorded]:
    events = [new.event for _, new in counts.take(replica="gw-1", start=T0, interval=10.0)]
    assert all(isinstance(e, TrafficRecorded) for e in events)
    return events  # type: ignore[return-value]


def test_exchanges_are_summed_per_lease_and_host_with_their_status_classes() -> None:
    counts = Counts()
    counts.add(exchange())
    counts.add(exchange(status=404, outcome="success"))
    counts.add(exchange(status=403, outcome="blocked", down=50))
    counts.add(exchange(outcome="failed", status=0, up=0, down=0))
    counts.add(exchange("cdn.example", tunnel=True, up=500, down=20_000))
    counts.add(exchange(lease_id="lease-2", status=301))
    one, two = taken(counts)
    assert (one.lease_id, one.proxy, two.lease_id) == ("lease-1", "crawl/de-3", "lease-2")
    cdn, shop = one.rows
    assert (cdn.host, cdn.tunnels, cdn.bytes_up, cdn.bytes_down) == ("cdn.example", 1, 500, 20_000)
    assert (shop.requests, shop.bytes_up, shop.bytes_down) == (4, 30, 2050)
    assert (shop.status_2xx, shop.status_4xx, shop.blocked, shop.failed) == (1, 2, 1, 1)
    assert two.rows[0].status_3xx == 1
    assert counts.empty()


def test_a_failed_tunnel_counts_as_failed_and_not_by_the_proxy_s_status() -> None:
    counts = Counts()
    counts.add(exchange(tunnel=True, outcome="failed", status=502, up=0, down=0))
    (event,) = taken(counts)
    assert (event.rows[0].failed, event.rows[0].status_5xx) == (1, 0)
    assert problem(event) is None


@pytest.mark.parametrize(
    ("host", "kept"),
    [
        ("Shop.Example.", "shop.example"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("2001:db8::1", "2001:db8::1"),
        ("xsshost<svg>.example", OTHER),
        ("a" * 300, OTHER),
        ("", OTHER),
    ],
)
def test_a_host_is_kept_in_its_stored_form_or_as_other(host: str, kept: str) -> None:
    assert host_key(host) == kept


def test_a_crawler_s_hostile_names_still_make_records_the_codec_writes() -> None:
    counts = Counts()
    counts.add(exchange("evil host\r\n", client="open label with spaces"))
    counts.add(exchange("x" * 2000, lease_id="\x00"))
    for event in taken(counts):
        assert problem(event) is None
        assert OTHER in {event.client, event.lease_id}


def test_a_record_names_the_busiest_hosts_and_sums_the_rest() -> None:
    counts = Counts()
    for i in range(MAX_ROWS + 10):
        counts.add(exchange(f"h{i}.example", down=i))
    (event,) = taken(counts)
    assert len(event.rows) == MAX_ROWS + 1
    assert event.rows[0].host == f"h{MAX_ROWS + 9}.example"
    assert event.rows[-1].host == OTHER
    assert event.rows[-1].requests == 10
    assert sum(r.bytes_down for r in event.rows) == sum(range(MAX_ROWS + 10))
    assert problem(event) is None


def test_beyond_the_keys_a_client_is_summed_under_other_then_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(traffic, "MAX_RECORDS", 3)
    monkeypatch.setattr(traffic, "MAX_OVERFLOW", 2)
    counts = Counts()
    for i in range(5):
        counts.add(exchange(lease_id=f"l{i}"))
    counts.add(exchange(client="crawler-b", lease_id="b1"))
    counts.add(exchange(client="crawler-c", lease_id="c1"))
    assert counts.dropped == 1
    events = taken(counts)
    keys = {(e.client, e.lease_id): e.rows[0].requests for e in events}
    assert keys == {
        ("crawler-a", "l0"): 1,
        ("crawler-a", "l1"): 1,
        ("crawler-a", "l2"): 1,
        ("crawler-a", OTHER): 2,
        ("crawler-b", OTHER): 1,
    }


def test_beyond_the_hosts_counted_the_rest_join_other(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traffic, "MAX_HOSTS", 4)
    counts = Counts()
    for i in range(10):
        counts.add(exchange(f"h{i}.example"))
    assert len(counts.records[("crawler-a", "uid-de-3", "lease-1")].hosts) == 5
    (event,) = taken(counts)
    assert event.rows[-1].host == OTHER
    assert event.rows[-1].requests == 6
    monkeypatch.setattr(traffic, "MAX_HOST_ROWS", 3)
    for lease in ("l1", "l2"):
        for i in range(3):
            counts.add(exchange(f"h{i}.example", lease_id=lease))
    assert counts.host_rows == 4
    assert set(counts.records[("crawler-a", "uid-de-3", "l2")].hosts) == {OTHER}


def test_the_message_id_is_the_replica_the_interval_and_the_key() -> None:
    def ids(replica: str, start: datetime) -> list[str]:
        counts = Counts()
        counts.add(exchange())
        counts.add(exchange(lease_id="lease-2"))
        return [new.msg_id for _, new in counts.take(replica=replica, start=start, interval=10)]

    first = ids("gw-1", T0)
    assert first == ids("gw-1", T0)
    assert len(set(first)) == 2
    assert set(first).isdisjoint(ids("gw-2", T0))
    assert set(first).isdisjoint(ids("gw-1", T0.replace(second=10)))


def test_the_backlog_is_bounded_in_number_and_age(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traffic, "MAX_PENDING", 3)
    backlog = Backlog()
    counts = Counts()
    for i in range(5):
        counts.add(exchange(lease_id=f"l{i}"))
    backlog.add(counts.take(replica="gw-1", start=T0, interval=10), now=0.0)
    assert (len(backlog), backlog.take_dropped()) == (3, 2)
    assert sum(len(v) for v in backlog.due(now=traffic.MAX_PENDING_AGE).values()) == 3
    assert backlog.due(now=traffic.MAX_PENDING_AGE + 1) == {}
    assert backlog.take_dropped() == 3


class Flaky(InMemoryEventStore):
    """Stores what it is given, then fails for the caller as if the acknowledgement was lost."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_acks = True

    async def append(
        self, aggregate: Aggregate, events: Sequence[NewEvent], expected_seq: int | None = None
    ) -> AppendResult:
        result = await super().append(aggregate, events, expected_seq)
        if self.lose_acks:
            raise StoreUnavailable("no acknowledgement")
        return result


async def test_a_failed_flush_is_appended_again_without_counting_twice() -> None:
    store = Flaky()
    now = [1000.0]
    recorder = TrafficRecorder(
        store,
        traffic_metrics(CollectorRegistry()),
        interval=10,
        replica="gw-1",
        clock=lambda: now[0],
    )
    recorder.count(exchange(down=700))
    now[0] += 10
    assert await recorder.flush() == 0
    assert len(recorder.backlog) == 1
    store.lose_acks = False
    recorder.count(exchange(down=300))
    now[0] += 10
    assert await recorder.flush() == 2
    assert len(recorder.backlog) == 0
    history = await store.read(subjects.traffic("crawler-a"))
    view = fold.fold(history.events)
    assert (view.records, view.total.bytes_down, view.total.requests) == (2, 1000, 2)
    assert recorder.metrics.failures._value.get() == 1


async def test_a_flush_without_the_log_keeps_the_records_for_the_next() -> None:
    store = Flaky()
    store.lose_acks = False
    down = [True]

    async def unavailable(*args: object, **kwargs: object) -> AppendResult:
        if down[0]:
            raise StoreUnavailable("NATS is down")
        return await InMemoryEventStore.append(store, *args, **kwargs)  # type: ignore[arg-type]

    store.append = unavailable  # type: ignore[method-assign]
    recorder = TrafficRecorder(
        store, traffic_metrics(CollectorRegistry()), interval=10, replica="gw-1"
    )
    recorder.count(exchange(client="crawler.a", down=5))
    assert await recorder.flush() == 0
    down[0] = False
    assert await recorder.flush() == 1
    history = await store.read(subjects.traffic(client_key("crawler.a")))
    (stored,) = history.decoded()
    assert isinstance(stored, TrafficRecorded)
    assert (stored.client, stored.rows[0].bytes_down) == ("crawler.a", 5)


def test_a_host_or_name_in_any_form_meets_its_kept_form_in_one_row() -> None:
    counts = Counts()
    for host in ("Shop.Example.", "shop.example", "SHOP.EXAMPLE"):
        counts.add(exchange(host, client="open label"))
    counts.add(exchange("shop.example", client="*"))
    (event,) = taken(counts)
    assert event.client == OTHER
    assert [(row.host, row.requests) for row in event.rows] == [("shop.example", 4)]


names = st.text(max_size=200)
exchanges = st.builds(
    Exchange,
    client=names,
    proxy_uid=names,
    proxy=st.text(max_size=300),
    lease_id=names,
    host=st.one_of(names, st.sampled_from(["shop.example", "10.0.0.1", "::1", "B\u00fccher.de"])),
    outcome=st.sampled_from(["success", "blocked", "failed"]),
    status=st.integers(min_value=0, max_value=999),
    up=st.integers(min_value=0, max_value=2**40),
    down=st.integers(min_value=0, max_value=2**40),
    tunnel=st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(exchanges, max_size=40))
def test_whatever_crawlers_send_the_records_are_ones_the_codec_writes(
    sent: list[Exchange],
) -> None:
    counts = Counts()
    for one in sent:
        counts.add(one)
    events = taken(counts)
    for event in events:
        assert problem(event) is None, event
        codec.encode(event)
    assert sum(row.requests for e in events for row in e.rows) == len(sent)
    assert sum(row.bytes_down for e in events for row in e.rows) == sum(s.down for s in sent)
