"""The live fleet's rows kept from discovery's change index (``console.fleet_rows``): a sync
rebuilds what changed or came due, a poll after one change gets that row alone, and the page and
counts kept as rows change are the ones a walk of the fleet gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from events.schemas import HealthChanged, LeaseAcquired, LeaseReleased, ProxyRemoved
from services.discovery.console.fleet_rows import FleetRows
from services.discovery.console.pure.fleet import NO_FILTERS, Filters, counts
from services.discovery.console.pure.fleet_page import Poll, View, answer, arrange, digest
from services.discovery.pure.changes import ChangeIndex
from tests.support.hand_views import Fleet

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
WHERE = digest([])


def _fleet(n: int) -> Fleet:
    fleet = Fleet()
    for i in range(n):
        fleet.proxy(f"p{i:03d}", {"tier": "gold" if i % 3 == 0 else "std"})
    return fleet


def _poll(rows: FleetRows, view: View) -> Poll:
    paged, summary = rows.listing(NO_FILTERS, view)
    order = digest([paged.page, paged.pages, *(r.uid for r in paged.rows)])
    return Poll(rows.instance, rows.version, WHERE, order, digest([summary]))


def _walk(rows: FleetRows, filters: Filters, view: View) -> tuple[list[str], object]:
    """The page and counts as a walk of every row gives them (what the kept ones must equal)."""
    every = [rows._kept[uid].row for _, _, uid in rows.order]
    shown = [r for r in every if filters.matches(r)]
    return [r.uid for r in arrange(shown, view, presorted=True).rows], counts(shown, every)


def test_a_poll_after_one_change_gets_that_row_alone() -> None:
    fleet = _fleet(30)
    rows = FleetRows()
    rows.sync(fleet.views, NOW)
    assert len(rows) == 30
    before = _poll(rows, View(size=10))
    rows.sync(fleet.views, NOW)  # nothing happened: nothing to rebuild, same version
    assert rows.quiet(before, WHERE)

    fleet.proxy("p004", {"tier": "std"}, HealthChanged(healthy=False, message="refused"))
    rows.sync(fleet.views, NOW)
    assert not rows.quiet(before, WHERE)
    now = _poll(rows, View(size=10))
    page = rows.listing(NO_FILTERS, View(size=10))[0].rows
    got = answer(before, now, page, rows.version_of)
    assert got.mode == "rows"
    assert [r.uid for r in got.changed] == ["p004"]
    assert got.changed[0].health == "unhealthy"
    assert rows.quiet(now, WHERE)
    assert not rows.quiet(now, digest([("health", "unhealthy")]))  # a token of another query


def test_a_token_of_another_process_query_or_the_future_gets_the_whole_table() -> None:
    fleet = _fleet(12)
    rows = FleetRows()
    rows.sync(fleet.views, NOW)
    now = _poll(rows, View(size=10))
    page = rows.listing(NO_FILTERS, View(size=10))[0].rows
    for before in (
        Poll("another", now.version, now.where, now.order, now.counts),
        Poll(now.instance, now.version + 1, now.where, now.order, now.counts),
        Poll(now.instance, now.version, digest(["q"]), now.order, now.counts),
    ):
        assert answer(before, now, page, rows.version_of).mode == "full"
        assert not rows.quiet(before, WHERE)
    assert answer(now, now, page, rows.version_of).mode == "nothing"


def test_a_lease_ending_changes_its_row_with_no_event() -> None:
    fleet = _fleet(5)
    fleet.lease("p002", LeaseAcquired(lease_id="l1", proxy_uid="p002", ttl_seconds=60), NOW)
    rows = FleetRows()
    rows.sync(fleet.views, NOW + timedelta(seconds=1))
    assert rows._kept["p002"].row.leased
    version, seen = rows.version, fleet.views.changes.version
    rows.sync(fleet.views, NOW + timedelta(seconds=59))
    assert rows.version == version  # not due yet: nothing rebuilt
    rows.sync(fleet.views, NOW + timedelta(seconds=61))
    assert fleet.views.changes.version == seen  # no event came
    assert not rows._kept["p002"].row.leased  # its time did
    assert rows.version == version + 1
    assert rows.version_of("p002") == rows.version
    assert rows.version_of("p001") <= version


def test_removed_and_declared_again_and_released() -> None:
    fleet = _fleet(6)
    rows = FleetRows()
    rows.sync(fleet.views, NOW)
    fleet.proxy("p003", {}, ProxyRemoved(uid="p003"))
    rows.sync(fleet.views, NOW)
    assert "p003" not in [uid for _, _, uid in rows.order]
    summary = rows.listing(NO_FILTERS, View())[1]
    assert (summary.total, summary.shown) == (5, 5)
    fleet.lease("p001", LeaseAcquired(lease_id="l1", proxy_uid="p001", ttl_seconds=60), NOW)
    fleet.lease("p001", LeaseReleased(lease_id="l1", proxy_uid="p001"), NOW + timedelta(seconds=1))
    rows.sync(fleet.views, NOW + timedelta(seconds=2))
    assert not rows._kept["p001"].row.leased
    fresh = Fleet(fleet.views)
    fresh.seq = fleet.seq
    fresh.views.proxies.views.pop("p003")  # a uid declared anew starts from no view
    fresh.proxy("p003", {"tier": "gold"})
    rows.sync(fleet.views, NOW + timedelta(seconds=2))
    assert len(rows) == 6
    assert rows.listing(NO_FILTERS, View())[1].total == 6


def test_kept_pages_and_counts_equal_a_walk_of_the_fleet() -> None:
    fleet = _fleet(47)
    fleet.proxy("p010", {}, HealthChanged(healthy=False))
    fleet.proxy("p011", {}, HealthChanged(healthy=False, latency_ms=3.0))
    rows = FleetRows()
    rows.sync(fleet.views, NOW)
    for filters in (
        NO_FILTERS,
        Filters(health="unhealthy"),
        Filters(phase="Ready"),
        Filters(attributes=(("tier", "gold"),)),
        Filters(health="healthy", search="p00"),
    ):
        for view in (
            View(size=10),
            View(size=10, page=3),
            View(size=10, page=5),
            View(size=10, page=99),
            View(size=10, page=2, descending=True),
            View(size=10, page=5, descending=True),
            View(sort="health", size=10, page=2),
        ):
            paged, summary = rows.listing(filters, view)
            uids, walked = _walk(rows, filters, view)
            assert [r.uid for r in paged.rows] == uids, (filters, view)
            assert summary == walked, (filters, view)


def test_a_reader_behind_what_the_index_keeps_reads_everything_again() -> None:
    fleet = _fleet(8)
    fleet.views.changes = ChangeIndex(keep=2)
    rows = FleetRows()
    rows.sync(fleet.views, NOW)
    assert len(rows) == 8  # the index keeps 2 uids, but a first sync reads every view
    read = fleet.views.changes.version
    for uid in ("p001", "p002", "p003"):
        fleet.proxy(uid, {}, HealthChanged(healthy=False))
    assert fleet.views.changes.since(read) is None  # three changed, two kept
    rows.sync(fleet.views, NOW)
    assert rows.listing(Filters(health="unhealthy"), View())[1].shown == 3
