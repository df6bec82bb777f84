"""Renewals in the lease fold: they move ``expires_at`` of the current lease only, keep its
fencing token, and any renewal the fold cannot use (unknown, released or expired lease, a
value out of bounds, stamped after its deadline) changes nothing and never raises."""

from __future__ import annotations

import math
from datetime import datetime

import pytest

from events.schemas import MAX_LEASE_SECONDS, LeaseExpired, LeaseRenewed
from projections.lease import EXPIRED, RELEASED
from projections.lease_queries import active, find, is_available, is_free
from tests.unit.test_lease_fold import Log, acquired, at, released


def renewed(lease_id: str, ttl: float, **more: object) -> LeaseRenewed:
    return LeaseRenewed(lease_id=lease_id, proxy_uid="p1", ttl_seconds=ttl, **more)  # type: ignore[arg-type]


def test_a_renewal_moves_the_end_from_its_own_time_and_keeps_the_token() -> None:
    view = Log().add(0, acquired("a", ttl=10)).add(8, renewed("a", 30)).view()
    assert view.current is not None
    assert (view.lease_id, view.fencing_token, view.granted) == ("a", 1, 1)
    assert view.current.expires_at == at(38)
    assert view.current.acquired_at == at(0)
    assert (view.current.renewed_at, view.current.renewed_seq) == (at(8), 2)
    assert view.current.ttl_seconds == 30
    assert active(view, "a", at(37.9)) is view.current
    assert not is_free(view, at(20))  # past the old end, still held


def test_a_renewal_may_shorten_the_lease() -> None:
    view = Log().add(0, acquired("a", ttl=600)).add(10, renewed("a", 5)).view()
    assert view.expires_at == at(15)
    assert is_free(view, at(15))


def test_an_expiry_before_the_new_end_is_ignored_and_after_it_counts() -> None:
    log = Log().add(0, acquired("a", ttl=10, cooldown=2)).add(5, renewed("a", 20))
    # A sweep that had not seen the renewal appends LeaseExpired at the old end: too early.
    view = log.add(11, LeaseExpired(lease_id="a", proxy_uid="p1")).view()
    assert view.lease_id == "a"
    view = log.add(25, LeaseExpired(lease_id="a", proxy_uid="p1")).view()
    assert view.current is None
    record = find(view, "a")
    assert record is not None
    assert (record.end, record.ended_at) == (EXPIRED, at(25))
    assert not is_available(view, at(26.9))
    assert is_available(view, at(27))


def test_a_renewal_cannot_outlive_the_grant_by_more_than_the_maximum() -> None:
    view = (
        Log()
        .add(0, acquired("a", ttl=MAX_LEASE_SECONDS))
        .add(MAX_LEASE_SECONDS - 10, renewed("a", MAX_LEASE_SECONDS))
        .view()
    )
    assert view.expires_at == at(MAX_LEASE_SECONDS)


def test_a_renewal_of_an_unknown_lease_changes_nothing() -> None:
    view = Log().add(0, acquired("a", ttl=10)).add(5, renewed("stranger", 600)).view()
    assert (view.lease_id, view.expires_at, view.unusable) == ("a", at(10), 0)
    assert Log().add(0, renewed("nobody", 60)).view().current is None


def test_a_renewal_of_a_released_lease_changes_nothing() -> None:
    view = Log().add(0, acquired("a", ttl=100)).add(5, released("a")).add(6, renewed("a", 60))
    folded = view.view()
    assert folded.current is None
    record = find(folded, "a")
    assert record is not None
    assert (record.end, record.expires_at) == (RELEASED, at(100))


def test_a_renewal_after_the_end_settles_the_expiry_instead() -> None:
    view = Log().add(0, acquired("a", ttl=10)).add(12, renewed("a", 60)).view()
    assert view.current is None
    record = find(view, "a")
    assert record is not None
    assert (record.end, record.ended_at, record.renewed_at) == (EXPIRED, at(10), None)


def test_a_renewal_stamped_after_its_deadline_changes_nothing() -> None:
    view = Log().add(0, acquired("a", ttl=10)).add(5, renewed("a", 60, deadline=at(3))).view()
    assert (view.expires_at, view.late) == (at(10), 1)


@pytest.mark.parametrize(
    "renewal",
    [
        renewed("a", -1),
        renewed("a", 0),
        renewed("a", math.nan),
        renewed("a", math.inf),
        renewed("a", 1e300),
        renewed("a", MAX_LEASE_SECONDS + 1),
        renewed("", 60),
        renewed("a", 60, deadline=datetime(2026, 1, 1)),  # naive: not comparable
    ],
)
def test_an_unusable_renewal_is_counted_and_changes_nothing(renewal: LeaseRenewed) -> None:
    view = Log().add(0, acquired("a", ttl=10)).add(5, renewal).view()
    assert (view.lease_id, view.expires_at, view.unusable, view.last_seq) == ("a", at(10), 1, 2)


def test_a_requested_ttl_out_of_bounds_is_only_shown_as_nothing() -> None:
    view = Log().add(0, acquired("a")).add(1, renewed("a", 60, requested_ttl_seconds=math.nan))
    current = view.view().current
    assert current is not None
    assert (current.requested_ttl_seconds, current.expires_at) == (0.0, at(61))
