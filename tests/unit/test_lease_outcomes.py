"""Outcome reports in the lease fold: back-offs per (proxy, target) that double and reset, claims
for a target refused while it has the proxy in back-off, counters, and reports the fold cannot
use (hostile bases, unknown outcomes, endless targets) that change nothing and never raise."""

from __future__ import annotations

import math
from datetime import timedelta

import msgspec
import pytest

from events.codec import InvalidEvent, encode
from events.schemas import MAX_BLOCK_BACKOFF_SECONDS, LeaseAcquired, LeaseReported
from projections.lease_queries import available_at, is_available
from projections.outcomes import (
    MAX_BACKOFFS,
    Reports,
    active_backoffs,
    backoff_seconds,
    record,
    target_key,
)
from tests.unit.test_lease_fold import Log, acquired, at, released

SHOP = "shop.example"


def report(outcome: str, target: str = SHOP, base: object = 100.0) -> LeaseReported:
    return LeaseReported(
        lease_id="a",
        proxy_uid="p1",
        outcome=outcome,
        target=target,
        backoff_seconds=base,  # type: ignore[arg-type]
    )


def claim(lease_id: str, target: str) -> LeaseAcquired:
    return msgspec.structs.replace(acquired(lease_id), target=target)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("shop.example", "shop.example"),
        ("Shop.Example.", "shop.example"),
        ("https://Shop.example:8443/cart?x=1", "shop.example"),
        ("shop.example:443", "shop.example"),
        ("shop.example/path", "shop.example"),
        ("  http://[::1]:80/  ", "::1"),
        ("", ""),
        ("   ", ""),
        ("http://", ""),
        ("http://[::1", ""),
        ("a" * 300, ""),
    ],
)
def test_a_target_is_its_host_name(text: str, key: str) -> None:
    assert target_key(text) == key


def test_the_back_off_doubles_up_to_a_day() -> None:
    assert [backoff_seconds(600, n) for n in (1, 2, 3)] == [600, 1200, 2400]
    assert backoff_seconds(600, 1_000_000) == MAX_BLOCK_BACKOFF_SECONDS
    assert backoff_seconds(0, 5) == 0
    assert backoff_seconds(600, 0) == 0


def test_a_blocked_report_starts_a_back_off_that_doubles_and_a_success_ends() -> None:
    log = Log().add(0, acquired("a", ttl=1000)).add(10, report("blocked"))
    view = log.view()
    assert view.reports.backoffs[SHOP].until == at(110)
    assert available_at(view, SHOP) == at(1000)  # the lease ends later than the back-off
    log.add(20, released("a"))
    view = log.view()
    assert available_at(view, SHOP) == at(110)
    assert available_at(view) == at(20)  # without a target, the back-off is no obstacle
    assert not is_available(view, at(109.9), SHOP)
    assert is_available(view, at(110), SHOP)
    assert is_available(view, at(21), "other.example")
    view = log.add(30, report("blocked", "https://SHOP.example/x")).view()
    assert (view.reports.backoffs[SHOP].blocks, view.reports.backoffs[SHOP].until) == (2, at(230))
    view = log.add(40, report("blocked")).view()
    assert view.reports.backoffs[SHOP].until == at(440)
    view = log.add(50, report("success", "shop.example:443")).view()
    assert SHOP not in view.reports.backoffs
    view = log.add(60, report("blocked")).view()
    assert (view.reports.backoffs[SHOP].blocks, view.reports.backoffs[SHOP].until) == (1, at(160))
    assert (view.reports.success, view.reports.blocked, view.reports.failed) == (1, 4, 0)


def test_a_claim_for_a_target_in_back_off_is_refused_and_others_hold() -> None:
    log = Log().add(0, acquired("a", ttl=5)).add(1, report("blocked")).add(2, released("a"))
    view = log.add(3, claim("b", SHOP)).view()
    assert (view.current, view.rejected) == (None, 1)
    view = log.add(4, claim("c", "other.example")).view()
    assert view.lease_id == "c"
    view = log.add(5, released("c")).add(101, claim("d", "SHOP.example")).view()
    assert view.lease_id == "d"  # the back-off ended at 101


def test_failed_reports_count_a_streak_that_success_and_blocked_break() -> None:
    log = Log().add(0, acquired("a", ttl=100))
    for second in (1, 2, 3):
        log.add(second, report("failed", ""))
    assert log.view().reports.failed_streak == 3
    assert log.add(4, report("blocked", "")).view().reports.failed_streak == 0
    log.add(5, report("failed")).add(6, report("failed"))
    view = log.add(7, report("success", "")).view()
    assert (view.reports.failed, view.reports.failed_streak) == (5, 0)
    assert view.reports.backoffs == {}  # a blocked report without a target starts none


@pytest.mark.parametrize(
    "base", [-1.0, math.nan, math.inf, True, "600", 2 * MAX_BLOCK_BACKOFF_SECONDS]
)
def test_a_report_with_an_unusable_base_is_counted_and_changes_nothing(base: object) -> None:
    view = Log().add(0, acquired("a", ttl=100)).add(1, report("blocked", base=base)).view()
    assert view.unusable == 1
    assert view.reports == Reports()
    assert view.outcomes == ()


def test_an_unknown_outcome_is_kept_but_not_counted() -> None:
    view = Log().add(0, acquired("a", ttl=100)).add(1, report("exploded")).view()
    assert view.reports == Reports()
    assert [o.outcome for o in view.outcomes] == ["exploded"]


def test_endless_targets_are_bounded_by_forgetting_the_oldest() -> None:
    reports = Reports()
    for n in range(MAX_BACKOFFS + 10):
        reports = record(reports, "blocked", f"host{n}.example", 60, at(n))
    assert len(reports.backoffs) == MAX_BACKOFFS
    assert "host0.example" not in reports.backoffs
    assert f"host{MAX_BACKOFFS + 9}.example" in reports.backoffs


def test_a_back_off_near_the_end_of_time_does_not_overflow() -> None:
    far = at(0).replace(year=9999, month=12, day=31)
    reports = record(Reports(), "blocked", SHOP, MAX_BLOCK_BACKOFF_SECONDS, far)
    assert reports.backoffs[SHOP].until.year == 9999
    assert active_backoffs(reports, far - timedelta(days=1))[0].target == SHOP


def test_the_old_reports_and_claims_fold_as_before() -> None:
    """Written before back-offs: no base (0) and no target; a blocked report starts nothing."""
    view = Log().add(0, acquired("a", ttl=5)).add(1, report("blocked", base=0.0)).view()
    assert view.reports.blocked == 1
    assert is_available(view, at(5), SHOP)


def test_the_codec_refuses_what_the_fold_could_not_use() -> None:
    with pytest.raises(InvalidEvent, match="backoff_seconds"):
        encode(report("blocked", base=MAX_BLOCK_BACKOFF_SECONDS + 1))
    with pytest.raises(InvalidEvent, match="outcome"):
        encode(report("exploded"))
    with pytest.raises(InvalidEvent, match="target"):
        encode(claim("b", "x" * 254))
    assert encode(report("blocked", base=600.0))
