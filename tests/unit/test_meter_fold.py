"""The meter fold (``projections.meter``): bytes per proxy and lease, today and in all, per
provider per UTC day with the latest budget, and "spent" once a day's bytes reach it; hostile
records in the log skipped and counted, never raised on (D162)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.meter import MAX_BYTES, UpstreamMetered
from events.meter import problem as meter_problem
from events.pool import PoolDemand
from events.store import Recorded, Unreadable
from projections import meter
from projections.meter import MeterView

DAY1 = datetime(2026, 12, 7, 9, tzinfo=UTC)
DAY2 = DAY1 + timedelta(days=1)


def metered(
    proxy_uid: str = "px-1", lease_id: str = "lease-1", provider: str = "resi-de", **fields: Any
) -> UpstreamMetered:
    values: dict[str, Any] = {
        "replica": "executor-1",
        "start": DAY1,
        "interval_seconds": 10.0,
        "requests": 1,
        **fields,
    }
    return UpstreamMetered(provider=provider, proxy_uid=proxy_uid, lease_id=lease_id, **values)


def stored(event: Any, at: datetime = DAY1, seq: int = 1, subject: str = "") -> Recorded:
    subject = subject or f"meter.{getattr(event, 'provider', 'resi-de')}"
    return Recorded(event, seq, subject, at)


def folded(*records: Recorded) -> dict[str, MeterView]:
    return meter.fold(list(records))


def test_bytes_sum_per_proxy_and_lease_today_and_in_all() -> None:
    views = folded(
        stored(metered(bytes_up=100, bytes_down=1000), DAY1, 1),
        stored(metered(lease_id="lease-2", bytes_up=5, bytes_down=50), DAY1, 2),
        stored(metered(lease_id="", bytes_up=1, bytes_down=2), DAY1, 3),
        stored(metered(lease_id="lease-2", bytes_up=7, bytes_down=70), DAY2, 4),
    )
    view = views["resi-de"]
    proxy = view.proxies["px-1"]
    assert (proxy.total.up, proxy.total.down) == (113, 1122)
    assert proxy.on(meter.day_of(DAY2)) == meter.Bytes(7, 70)
    assert proxy.on(meter.day_of(DAY1)) == meter.Bytes()  # only its latest day is kept apart
    assert (view.leases["lease-1"].total.up, view.leases["lease-2"].total.down) == (100, 120)
    assert "" not in view.leases  # the prober's bytes count for the proxy only
    assert meter.bytes_on(view, "px-1", meter.day_of(DAY2)) == meter.Bytes(7, 70)
    assert meter.bytes_on(view, "nobody", meter.day_of(DAY2)) == meter.Bytes()
    assert (view.records, view.unusable, view.last_seq) == (4, 0, 4)


def test_a_day_is_the_server_stamps_not_the_replicas_start() -> None:
    # The replica says the interval began tomorrow; the server stored it today.
    view = folded(stored(metered(start=DAY2, bytes_up=10), DAY1))["resi-de"]
    assert list(view.days) == [meter.day_of(DAY1)]


def test_a_budget_is_spent_when_todays_bytes_reach_it_and_not_the_next_day() -> None:
    budget = 1000
    first = stored(metered(bytes_up=400, bytes_down=500, budget_bytes_per_day=budget), DAY1, 1)
    view = folded(first)["resi-de"]
    assert meter.spent(view, DAY1) is None  # 900 of 1000
    view = meter.apply(view, stored(metered(bytes_down=100, budget_bytes_per_day=budget), DAY1, 2))
    spent = meter.spent(view, DAY1 + timedelta(hours=3))
    assert spent == meter.Spent("resi-de", 1000, 1000, datetime(2026, 12, 8, tzinfo=UTC))
    assert "leasable again at 2026-12-08T00:00:00Z" in spent.words()
    assert meter.spent(view, DAY2) is None  # a new UTC day starts from nothing


def test_the_latest_budget_of_the_day_counts_and_zero_is_none() -> None:
    view = folded(
        stored(metered(bytes_up=2000, budget_bytes_per_day=1000), DAY1, 1),
        stored(metered(bytes_up=1, budget_bytes_per_day=5000), DAY1, 2),
    )["resi-de"]
    assert meter.spent(view, DAY1) is None  # raised to 5000: 2001 is within it
    view = meter.apply(view, stored(metered(bytes_up=1, budget_bytes_per_day=0), DAY1, 3))
    assert meter.spent(view, DAY1) is None  # no budget at all
    assert view.days[meter.day_of(DAY1)].used == 2002
    assert meter.spent(None, DAY1) is None


def test_days_and_keys_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meter, "MAX_KEYS", 2)
    records = [
        stored(metered(proxy_uid=f"px-{n}", lease_id=f"l-{n}", bytes_up=1), DAY1 + timedelta(n), n)
        for n in range(1, 12)
    ]
    view = folded(*records)["resi-de"]
    assert len(view.days) == meter.MAX_DAYS
    assert min(view.days) == meter.day_of(DAY1 + timedelta(days=4))  # days 1 to 11 stored
    assert set(view.proxies) == {"px-1", "px-2", meter.OTHER}
    assert view.proxies[meter.OTHER].total.up == 9
    assert set(view.leases) == {"l-1", "l-2", meter.OTHER}


HOSTILE: list[tuple[str, Any]] = [
    ("negative bytes", metered(bytes_up=-5)),
    ("bytes beyond exact", metered(bytes_down=MAX_BYTES + 1)),
    ("a float count", metered(bytes_up=1.5)),
    ("a bool count", metered(bytes_up=True)),
    ("a negative budget", metered(budget_bytes_per_day=-1)),
    ("a naive start", metered(start=datetime(2026, 12, 7))),
    ("no interval", metered(interval_seconds=0.0)),
    ("a nan interval", metered(interval_seconds=math.nan)),
    ("a spaced proxy uid", metered(proxy_uid="px 1")),
    ("a provider with a dot", metered(provider="resi.de")),
]


@pytest.mark.parametrize(("why", "event"), HOSTILE, ids=[w for w, _ in HOSTILE])
def test_a_hostile_record_is_skipped_and_counted(why: str, event: UpstreamMetered) -> None:
    del why
    view = folded(stored(event, subject="meter.resi-de"))["resi-de"]
    assert (view.records, view.unusable, view.days, view.proxies) == (0, 1, {}, {})


def test_a_record_under_another_providers_subject_or_no_record_is_skipped() -> None:
    view = folded(
        stored(metered(provider="other", bytes_up=10**6), subject="meter.resi-de", seq=1),
        stored(PoolDemand(uid="p", replica="r", waiting=1), subject="meter.resi-de", seq=2),
        stored(Unreadable(type="Junk", reason="junk"), subject="meter.resi-de", seq=3),
    )["resi-de"]
    assert (view.records, view.unusable, view.days, view.last_seq) == (0, 3, {}, 3)


NAMES = st.sampled_from(["px-1", "px-2", "", " ", "a b", "x" * 200, "*", "é"])
COUNTS = st.one_of(
    st.integers(-(2**60), 2**60),
    st.floats(allow_nan=True),
    st.booleans(),
    st.sampled_from([0, 1, MAX_BYTES, MAX_BYTES + 1]),
)
RECORDS = st.builds(
    metered,
    proxy_uid=NAMES,
    lease_id=NAMES,
    provider=st.sampled_from(["resi-de", "resi.de", "", "other"]),
    bytes_up=COUNTS,
    bytes_down=COUNTS,
    budget_bytes_per_day=COUNTS,
    requests=COUNTS,
    interval_seconds=st.one_of(st.floats(allow_nan=True), st.just(10.0)),
    start=st.sampled_from([DAY1, datetime(2026, 12, 7)]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(RECORDS, st.integers(0, 3 * 24 * 60)), max_size=30))
def test_hostile_records_change_nothing_the_good_ones_make(
    records: list[tuple[UpstreamMetered, int]],
) -> None:
    """Whatever the log holds, the fold never raises, counts each record usable or not once,
    and its sums are those of the usable records alone; spent follows from them."""
    stamped = [
        stored(event, DAY1 + timedelta(minutes=minute), seq, subject="meter.resi-de")
        for seq, (event, minute) in enumerate(sorted(records, key=lambda r: r[1]), 1)
    ]
    views = folded(*stamped)
    view = views.get("resi-de", MeterView(provider="resi-de"))
    good = [
        r
        for r in stamped
        if isinstance(r.event, UpstreamMetered)
        and r.event.provider == "resi-de"
        and meter_problem(r.event) is None
    ]
    assert view.records == len(good)
    assert view.unusable == len(stamped) - len(good)
    for day, totals in view.days.items():
        ofday = [r.event for r in good if meter.day_of(r.timestamp) == day]
        assert isinstance(ofday[0], UpstreamMetered)
        assert totals.up == sum(e.bytes_up for e in ofday if isinstance(e, UpstreamMetered))
        last = ofday[-1]
        assert isinstance(last, UpstreamMetered)
        assert totals.budget == last.budget_bytes_per_day
        at = datetime.fromisoformat(day).replace(tzinfo=UTC)
        assert (meter.spent(view, at) is not None) == (
            totals.budget > 0 and totals.up + totals.down >= totals.budget
        )
    assert sum(u.total.up for u in view.proxies.values()) == sum(d.up for d in view.days.values())
