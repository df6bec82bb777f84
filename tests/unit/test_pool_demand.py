"""The demand on a pool: discovery's reporter (``services.discovery.leasing.demand``) and the
fold the controller reads it with (``projections.pool_demand``): fresh reports summed, stale
ones left, holders counted once, and every hostile report skipped and counted, never trusted."""

from __future__ import annotations

import asyncio
import contextlib
import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import subjects
from events.pool import PoolDemand
from events.store import Recorded
from projections import pool_demand
from projections.pool_demand import MAX_REPLICAS, Demand, DemandView, current
from services.discovery.leasing.demand import MAX_HOLDERS, Asker, DemandReporter
from services.runtime.eventlog.memory import InMemoryEventStore
from tests.support.waiting import until

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POOL = "pool-uid-1"


def recorded(event: PoolDemand, seconds: float = 0.0, seq: int = 1) -> Recorded:
    return Recorded(event, seq, f"demand.{POOL}", T0 + timedelta(seconds=seconds))


def fold(*items: Recorded) -> DemandView | None:
    view = None
    for item in items:
        view = pool_demand.apply(view, item)
    return view


def report(replica: str = "r1", **fields: object) -> PoolDemand:
    values: dict[str, object] = {"interval_seconds": 5.0, **fields}
    return PoolDemand(uid=POOL, replica=replica, **values)  # type: ignore[arg-type]


def test_fresh_reports_of_every_replica_are_summed() -> None:
    view = fold(
        recorded(report("r1", waiting=2, unserved=3, refused={"busy": 4})),
        recorded(report("r2", waiting=1, unserved=1, refused={"busy": 1, "scaling": 2}), 1, 2),
    )
    got = current(view, T0 + timedelta(seconds=2))
    assert got == Demand(waiting=3, refused={"busy": 5, "scaling": 2}, unserved=4)


def test_a_replica_counts_its_last_report_only() -> None:
    view = fold(
        recorded(report("r1", waiting=5, unserved=5)),
        recorded(report("r1", waiting=0, unserved=0), 5, 2),
    )
    assert current(view, T0 + timedelta(seconds=6)) == Demand()


def test_a_report_goes_stale_after_three_intervals() -> None:
    view = fold(recorded(report("r1", waiting=2, unserved=2)))
    assert current(view, T0 + timedelta(seconds=15)).unserved == 2
    assert current(view, T0 + timedelta(seconds=15.001)) == Demand()
    assert current(None, T0) == Demand()


@pytest.mark.parametrize(
    "fields",
    [
        {"waiting": -1},
        {"unserved": 10**9},
        {"refused": {"busy": -3}},
        {"refused": {"because": 1}},
        {"interval_seconds": 0.0},
        {"interval_seconds": math.nan},
        {"interval_seconds": math.inf},
        {"interval_seconds": 1e9},
    ],
)
def test_a_report_no_discovery_writes_is_skipped_and_counted(fields: dict[str, object]) -> None:
    view = fold(recorded(report("r1", unserved=1)), recorded(report("r2", **fields), 0, 2))
    assert view is not None
    assert view.unusable == 1
    assert set(view.reports) == {"r1"}


@pytest.mark.parametrize("replica", ["", "a b", "x" * 129, "r\n", "a.>"])
def test_a_replica_name_no_discovery_writes_is_skipped(replica: str) -> None:
    view = fold(recorded(report(replica, unserved=1)))
    assert view is not None
    assert view.unusable == 1
    assert not view.reports


def test_invented_replicas_cannot_grow_the_view_without_bound() -> None:
    items = [recorded(report(f"r{i}", unserved=1), i, i + 1) for i in range(MAX_REPLICAS + 50)]
    view = fold(*items)
    assert view is not None
    assert len(view.reports) == MAX_REPLICAS
    assert "r0" not in view.reports  # the oldest went
    assert f"r{MAX_REPLICAS + 49}" in view.reports


@given(
    st.lists(
        st.builds(
            PoolDemand,
            uid=st.just(POOL),
            replica=st.text(max_size=10),
            waiting=st.integers(-5, 2**40),
            unserved=st.integers(-5, 2**40),
            refused=st.dictionaries(st.text(max_size=8), st.integers(-5, 2**40), max_size=3),
            interval_seconds=st.floats(allow_nan=True, allow_infinity=True),
        ),
        max_size=20,
    )
)
@settings(max_examples=200, deadline=None)
def test_any_reports_fold_into_a_bounded_demand(reports: list[PoolDemand]) -> None:
    view = fold(*(recorded(r, i, i + 1) for i, r in enumerate(reports)))
    got = current(view, T0 + timedelta(seconds=len(reports)))
    assert 0 <= got.waiting <= 10_000
    assert 0 <= got.unserved <= 10_000
    assert all(n >= 0 for n in got.refused.values())


# ------------------------------------------------------------------------------- reporter


def test_holders_are_counted_once_and_refusals_start_again_each_interval() -> None:
    reporter = DemandReporter(InMemoryEventStore(), replica="d1")
    for _ in range(5):
        reporter.refused(POOL, Asker("c", "crawler-1"), "busy")  # one crawler retrying
    reporter.waiting(POOL, Asker("c", "crawler-2"), 1)
    reporter.waiting(POOL, Asker("c", "crawler-2"), 1)  # two requests of one holder
    [first] = reporter.take()
    assert (first.waiting, first.unserved, first.refused) == (2, 2, {"busy": 5})
    [second] = reporter.take()  # the waiting go on; the refusals were the interval's
    assert (second.waiting, second.unserved, second.refused) == (2, 1, {})
    reporter.waiting(POOL, Asker("c", "crawler-2"), -2)
    [last] = reporter.take()  # the end of the demand is reported once
    assert (last.waiting, last.unserved, last.refused) == (0, 0, {})
    assert reporter.take() == []


def test_a_pool_nobody_waited_for_is_never_reported() -> None:
    reporter = DemandReporter(InMemoryEventStore(), replica="d1")
    reporter.waiting(POOL, Asker("c", "h"), 1)
    reporter.waiting(POOL, Asker("c", "h"), -1)
    assert reporter.take() == []


def test_holders_remembered_are_bounded() -> None:
    reporter = DemandReporter(InMemoryEventStore(), replica="d1")
    for i in range(MAX_HOLDERS + 100):
        reporter.refused(POOL, Asker("c", f"h{i}"), "scaling")
        reporter.waiting(POOL, Asker("c", f"w{i}"), 1)
    [got] = reporter.take()
    assert got.refused == {"scaling": MAX_HOLDERS + 100}
    assert got.waiting == MAX_HOLDERS + 100
    assert got.unserved <= 2 * MAX_HOLDERS + 1


async def test_reports_reach_the_pools_demand_subject() -> None:
    store = InMemoryEventStore()
    reporter = DemandReporter(store, replica="d1", interval=5.0)
    reporter.refused(POOL, Asker("c", "h"), "busy")
    assert await reporter.report_once() == 1
    history = await store.read(subjects.demand(POOL))
    [item] = history.events
    assert item.event == PoolDemand(
        uid=POOL, replica="d1", refused={"busy": 1}, unserved=1, interval_seconds=5.0
    )
    assert await reporter.report_once() == 1  # the end of it
    assert await reporter.report_once() == 0


def test_a_client_counts_for_at_most_the_leases_it_may_still_hold() -> None:
    """A client inventing holder names cannot grow a pool past what it could lease."""
    reporter = DemandReporter(InMemoryEventStore(), replica="d1")
    for i in range(50):
        reporter.refused(POOL, Asker("greedy", f"h{i}", limit=3), "busy")
    reporter.waiting(POOL, Asker("open", "w1"), 1)
    reporter.waiting(POOL, Asker("open", "w2"), 1)
    [got] = reporter.take()
    assert got.unserved == 3 + 2
    assert got.refused == {"busy": 50}


def test_a_saturated_waiter_is_counted_and_ends() -> None:
    reporter = DemandReporter(InMemoryEventStore(), replica="d1")
    askers = [Asker("c", f"w{i}") for i in range(MAX_HOLDERS + 5)]
    for asker in askers:
        reporter.waiting(POOL, asker, 1)
    [got] = reporter.take()
    assert got.waiting == MAX_HOLDERS + 5
    for asker in askers:
        reporter.waiting(POOL, asker, -1)
    [last] = reporter.take()
    assert last.waiting == 0
    assert reporter.take() == []


async def test_a_pool_uid_no_subject_can_hold_is_dropped_and_the_others_reported() -> None:
    """A hand-written PoolDeclared may carry any uid; discovery's reporter must not die of it."""
    store = InMemoryEventStore()
    reporter = DemandReporter(store, replica="d1")
    reporter.refused("a b.>", Asker("c", "h"), "busy")
    reporter.refused(POOL, Asker("c", "h"), "busy")
    assert await reporter.report_once() == 1
    [stored] = (await store.read(subjects.demand(POOL))).events
    assert isinstance(stored.event, PoolDemand)
    assert stored.event.uid == POOL
    assert "a b.>" not in reporter.pools


def test_a_client_counts_against_its_limit_less_what_it_holds_when_reported() -> None:
    """Its leased members and its unserved holders together stay within its maxLeases (D135):
    refused while it held one lease, then granted a second, it lacks nothing more."""
    held = {"greedy": 1}
    reporter = DemandReporter(InMemoryEventStore(), replica="d1", held=held.__getitem__)
    for i in range(40):
        reporter.refused(POOL, Asker("greedy", f"h{i}", limit=2), "busy")
    held["greedy"] = 2
    [got] = reporter.take()
    assert got.unserved == 0
    for i in range(40):
        reporter.refused(POOL, Asker("greedy", f"h{i}", limit=2), "busy")
    held["greedy"] = 1
    [got] = reporter.take()
    assert got.unserved == 1


async def figures(store: InMemoryEventStore) -> list[tuple[int, int]]:
    """(waiting, unserved) of every report on the pool's subject, oldest first."""
    got = []
    for item in (await store.read(subjects.demand(POOL))).events:
        assert isinstance(item.event, PoolDemand)
        got.append((item.event.waiting, item.event.unserved))
    return got


async def test_a_served_waiter_is_reported_at_once_not_at_the_next_interval() -> None:
    """Counted leased and unserved at once until the next report, it grew a pool by one member
    that nobody needed (the autoscale e2e test saw 5 crawlers make 6 members)."""
    store = InMemoryEventStore()
    reporter = DemandReporter(store, replica="d1", interval=5.0)
    for holder in ("w1", "w2"):
        reporter.waiting(POOL, Asker("c", holder), 1)
    assert await reporter.report_once() == 1
    assert await reporter.report_moved() == 0  # nothing fell
    reporter.waiting(POOL, Asker("c", "w1"), -1)  # w1 served
    assert reporter.moved == {POOL}
    assert await reporter.report_moved() == 1
    assert await figures(store) == [(2, 2), (1, 1)]
    assert await reporter.report_moved() == 0  # restated once


async def test_a_refused_holder_granted_later_stops_counting_in_its_interval() -> None:
    store = InMemoryEventStore()
    reporter = DemandReporter(store, replica="d1", interval=5.0)
    reporter.refused(POOL, Asker("c", "r1"), "scaling")
    reporter.refused(POOL, Asker("c", "r2"), "scaling")
    assert await reporter.report_once() == 1
    reporter.refused(POOL, Asker("c", "r1"), "scaling")  # retrying in the next interval
    reporter.served(POOL, Asker("c", "r1"))
    reporter.served(POOL, Asker("c", "unknown"))  # never refused: nothing moves for it
    [early] = reporter.take_moved()
    assert (early.unserved, early.refused) == (0, {"scaling": 1})  # the interval goes on
    [regular] = reporter.take()
    assert (regular.unserved, regular.refused) == (0, {"scaling": 1})


async def test_a_waiter_that_never_counted_moves_nothing() -> None:
    reporter = DemandReporter(InMemoryEventStore(), replica="d1")
    reporter.waiting(POOL, Asker("c", "w"), 1)
    reporter.waiting(POOL, Asker("c", "w"), -1)
    assert reporter.moved == set()


async def test_an_early_report_of_something_gets_its_end() -> None:
    store = InMemoryEventStore()
    reporter = DemandReporter(store, replica="d1", interval=5.0)
    for holder in ("w1", "w2"):
        reporter.waiting(POOL, Asker("c", holder), 1)
    assert await reporter.report_once() == 1
    reporter.waiting(POOL, Asker("c", "w1"), -1)
    assert await reporter.report_moved() == 1
    reporter.waiting(POOL, Asker("c", "w2"), -1)
    assert await reporter.report_moved() == 1  # of nothing: the demand ended
    assert await reporter.report_once() == 0
    assert await figures(store) == [(2, 2), (1, 1), (0, 0)]


async def test_the_reporter_reports_a_served_waiter_within_its_settle_time() -> None:
    store = InMemoryEventStore()
    reporter = DemandReporter(store, replica="d1", interval=3600.0)
    reporter.waiting(POOL, Asker("c", "w1"), 1)
    assert await reporter.report_once() == 1
    running = asyncio.create_task(reporter.run())
    try:
        reporter.waiting(POOL, Asker("c", "w1"), -1)

        async def reported_twice() -> bool:
            return await figures(store) == [(1, 1), (0, 0)]

        await until(reported_twice, timeout=10.0, what="the early report")
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
