"""The lease fold against events it cannot use: hostile values (written before the codec refused
them, or published straight to the subject) and late writes (stamped after their deadline). The
log is immutable, so the fold must apply any of them without raising, and hold nothing for them."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.schemas import (
    MAX_COOLDOWN_SECONDS,
    MAX_LEASE_SECONDS,
    Event,
    LeaseAcquired,
    LeaseExpired,
    LeaseReleased,
    LeaseRenewed,
    LeaseReported,
)
from events.store import Recorded
from projections.lease import HISTORY, RELEASED, apply, fold
from projections.lease_queries import available_at, find, indexed, is_available, is_free
from tests.unit.test_lease_fold import T0, Log, acquired, at, released

# ------------------------------------------------------------------------- hostile events
# The log is immutable: whatever an event holds (written before the codec refused it, or
# published straight to the subject), the fold must apply it without raising.


@pytest.mark.parametrize(
    "claim",
    [
        acquired("h", ttl=1e12),  # timedelta overflows past the year 9999
        acquired("h", ttl=1e300),
        acquired("h", ttl=-5),
        acquired("h", ttl=0),
        acquired("h", ttl=math.nan),
        acquired("h", ttl=math.inf),
        acquired("h", ttl=MAX_LEASE_SECONDS + 1),
        acquired("h", cooldown=1e12),
        acquired("h", cooldown=-1),
        acquired("h", cooldown=math.nan),
        acquired("", ttl=10),
        LeaseAcquired(lease_id="h", proxy_uid="p1", ttl_seconds=10, deadline=datetime(2026, 1, 1)),
    ],
)
def test_an_unusable_claim_is_counted_and_holds_nothing(claim: LeaseAcquired) -> None:
    log = Log().add(1, claim)
    view = log.view()
    assert (view.current, view.granted, view.unusable, view.fencing_token) == (None, 0, 1, 0)
    assert is_available(view, at(1))
    assert view.last_seq == 1
    view = log.add(2, acquired("next", ttl=10)).view()
    # The first grant; its token is its sequence, after the unusable claim's.
    assert (view.lease_id, view.fencing_token, view.granted) == ("next", 2, 1)


def test_a_claim_at_the_bounds_holds() -> None:
    view = Log().add(0, acquired("a", ttl=MAX_LEASE_SECONDS, cooldown=MAX_COOLDOWN_SECONDS)).view()
    assert view.lease_id == "a"
    assert available_at(view) == at(MAX_LEASE_SECONDS + MAX_COOLDOWN_SECONDS)


@pytest.mark.parametrize("cooldown", [1e12, -1.0, math.nan, math.inf])
def test_an_unusable_release_leaves_the_lease_held(cooldown: float) -> None:
    view = Log().add(0, acquired("a")).add(1, released("a", cooldown=cooldown)).view()
    assert (view.lease_id, view.unusable) == ("a", 1)
    assert not is_free(view, at(2))


@pytest.mark.parametrize("requested", [math.nan, -1.0, math.inf, 1e300])
def test_a_requested_ttl_of_any_value_is_only_shown(requested: float) -> None:
    claim = LeaseAcquired(
        lease_id="a", proxy_uid="p1", ttl_seconds=60, requested_ttl_seconds=requested
    )
    view = Log().add(0, claim).view()
    assert view.current is not None
    shown = view.current.requested_ttl_seconds
    assert math.isfinite(shown)
    assert shown == (requested if math.isfinite(requested) and requested >= 0 else 0.0)


def test_near_the_end_of_time_nothing_overflows() -> None:
    end = datetime(9999, 12, 31, tzinfo=UTC)
    recorded = Recorded(
        event=acquired("a", ttl=MAX_LEASE_SECONDS, cooldown=MAX_COOLDOWN_SECONDS),
        seq=1,
        subject="lease.p1",
        timestamp=end,
    )
    view = apply(None, recorded)
    assert view.lease_id == "a"
    assert view.expires_at is not None
    assert view.expires_at > end
    assert available_at(view) is not None


# ---------------------------------------------------------------------------- late writes


def test_a_claim_stamped_after_its_deadline_holds_nothing() -> None:
    """The writer answered 503 at its deadline; nats-py sent the buffered claim later."""
    late = LeaseAcquired(lease_id="ghost", proxy_uid="p1", ttl_seconds=60, deadline=at(2))
    view = Log().add(30, late).view()
    assert (view.current, view.late, view.granted, view.fencing_token) == (None, 1, 0, 0)
    on_time = LeaseAcquired(lease_id="real", proxy_uid="p1", ttl_seconds=60, deadline=at(32))
    view = Log().add(30, late).add(31, on_time).view()
    assert (view.lease_id, view.fencing_token, view.granted) == ("real", 2, 1)
    exactly = LeaseAcquired(lease_id="edge", proxy_uid="p1", ttl_seconds=60, deadline=at(5))
    assert Log().add(5, exactly).view().lease_id == "edge"


def test_a_late_release_leaves_the_lease_held_and_a_late_report_unrecorded() -> None:
    log = (
        Log()
        .add(0, acquired("a", ttl=600))
        .add(10, LeaseReleased(lease_id="a", proxy_uid="p1", deadline=at(5)))
        .add(11, LeaseReported(lease_id="a", proxy_uid="p1", outcome="failed", deadline=at(3)))
    )
    view = log.view()
    assert (view.lease_id, view.late) == ("a", 2)
    assert view.outcomes == ()
    assert view.current is not None
    assert view.current.outcomes == ()
    view = log.add(12, LeaseReleased(lease_id="a", proxy_uid="p1", deadline=at(14))).view()
    assert view.current is None
    record = find(view, "a")
    assert record is not None
    assert record.end == RELEASED


def test_an_aware_deadline_in_another_zone_is_compared_as_an_instant() -> None:
    plus_two = timezone(timedelta(hours=2))
    deadline = (T0 + timedelta(seconds=5)).astimezone(plus_two)
    claim = LeaseAcquired(lease_id="a", proxy_uid="p1", ttl_seconds=60, deadline=deadline)
    assert Log().add(4, claim).view().lease_id == "a"
    assert Log().add(6, claim).view().late == 1


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=1e6),
            st.sampled_from(["acquire", "release", "report", "expire", "renew"]),
            st.sampled_from(["a", "b", ""]),
            st.floats(allow_nan=True, allow_infinity=True),
            st.floats(allow_nan=True, allow_infinity=True),
            st.none() | st.datetimes(timezones=st.none() | st.just(UTC)),
        ),
        max_size=12,
    )
)
def test_no_event_makes_the_fold_raise(
    steps: list[tuple[float, str, str, float, float, datetime | None]],
) -> None:
    log = Log()
    for offset, kind, lease_id, seconds, cooldown, deadline in sorted(steps, key=lambda s: s[0]):
        when: datetime | msgspec.UnsetType = msgspec.UNSET if deadline is None else deadline
        event: Event
        if kind == "acquire":
            event = LeaseAcquired(
                lease_id=lease_id,
                proxy_uid="p1",
                ttl_seconds=seconds,
                cooldown_seconds=cooldown,
                requested_ttl_seconds=seconds,
                deadline=when,
            )
        elif kind == "release":
            event = LeaseReleased(
                lease_id=lease_id, proxy_uid="p1", cooldown_seconds=cooldown, deadline=when
            )
        elif kind == "report":
            event = LeaseReported(
                lease_id=lease_id, proxy_uid="p1", outcome="failed", deadline=when
            )
        elif kind == "renew":
            event = LeaseRenewed(
                lease_id=lease_id,
                proxy_uid="p1",
                ttl_seconds=seconds,
                requested_ttl_seconds=cooldown,
                deadline=when,
            )
        else:
            event = LeaseExpired(lease_id=lease_id, proxy_uid="p1")
        log.add(offset, event)
    view = fold(log.events)
    if view is None:
        assert not steps
        return
    assert view.last_seq == len(steps)
    if view.current is not None:
        assert 0 < view.current.ttl_seconds <= MAX_LEASE_SECONDS
        assert 0 <= view.current.cooldown_seconds <= MAX_COOLDOWN_SECONDS
        assert view.current.lease_id
        assert view.current.expires_at <= view.current.acquired_at + timedelta(
            seconds=MAX_LEASE_SECONDS
        )
    now = at(2e6)
    is_available(view, now)  # every question about the view answers too
    # The token is the newest grant's sequence: the current lease, or the last one ended.
    newest = view.current or (view.recent[-1] if view.recent else None)
    assert view.fencing_token == (newest.seq if newest else 0)
    assert view.fencing_token >= view.granted
    tokens = [r.fencing_token for r in view.recent]
    tokens += [view.current.fencing_token] if view.current else []
    assert all(a < b for a, b in pairwise(tokens))


def test_a_lease_id_reused_on_another_proxy_keeps_its_index_entry() -> None:
    index: dict[str, str] = {}
    track = indexed(index)
    first = Recorded(event=acquired("same", ttl=1), seq=1, subject="lease.p1", timestamp=at(0))
    p1 = track(None, first)
    again = LeaseAcquired(lease_id="same", proxy_uid="p2", ttl_seconds=60)
    track(None, Recorded(event=again, seq=2, subject="lease.p2", timestamp=at(5)))
    assert index["same"] == "p2"
    # p1's history forgets its old lease: the entry now belongs to p2 and stays.
    for i in range(HISTORY + 1):
        later = Recorded(
            event=acquired(f"x{i}", ttl=1), seq=3 + i, subject="lease.p1", timestamp=at(10 + i * 2)
        )
        p1 = track(p1, later)
    assert find(p1, "same") is None
    assert index["same"] == "p2"
