"""The lease fold, without servers: grants, refusals, expiry, cooldown, reports, the index."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from events.schemas import (
    Event,
    HealthChanged,
    LeaseAcquired,
    LeaseExpired,
    LeaseReleased,
    LeaseReported,
)
from events.store import Recorded
from projections.lease import ACTIVE, EXPIRED, HISTORY, RELEASED, LeaseView, apply, fold
from projections.lease_queries import (
    active,
    available_at,
    find,
    indexed,
    is_available,
    is_free,
    state_of,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Log:
    """Events of ``lease.p1`` with chosen JetStream timestamps."""

    def __init__(self) -> None:
        self.events: list[Recorded] = []

    def add(self, seconds: float, event: Event) -> Log:
        seq = len(self.events) + 1
        recorded = Recorded(event=event, seq=seq, subject="lease.p1", timestamp=at(seconds))  # type: ignore[arg-type]
        self.events.append(recorded)
        return self

    def view(self) -> LeaseView:
        view = fold(self.events)
        assert view is not None
        return view


def acquired(lease_id: str, ttl: float = 10.0, cooldown: float = 0.0) -> LeaseAcquired:
    return LeaseAcquired(
        lease_id=lease_id,
        proxy_uid="p1",
        holder=f"holder-{lease_id}",
        ttl_seconds=ttl,
        selector={"country": "de"},
        cooldown_seconds=cooldown,
    )


def released(lease_id: str, cooldown: float = 0.0) -> LeaseReleased:
    return LeaseReleased(lease_id=lease_id, proxy_uid="p1", cooldown_seconds=cooldown)


def test_a_grant_holds_until_its_end() -> None:
    view = Log().add(1, acquired("a", ttl=10)).view()
    assert view.proxy_uid == "p1"
    assert (view.lease_id, view.holder, view.fencing_token) == ("a", "holder-a", 1)
    assert view.acquired_at == at(1)
    assert view.expires_at == at(11)
    assert view.current is not None
    assert view.current.selector == {"country": "de"}
    assert not is_free(view, at(10.999))
    assert is_free(view, at(11))  # no event needed: past its end it is free
    assert state_of(view.current, at(5)) == ACTIVE
    assert state_of(view.current, at(11)) == EXPIRED
    assert is_free(None, at(0))
    assert is_available(None, at(0))


def test_a_claim_while_held_is_refused_and_changes_nothing() -> None:
    log = Log().add(1, acquired("a")).add(2, acquired("b"))
    view = log.view()
    assert (view.lease_id, view.fencing_token, view.granted, view.rejected) == ("a", 1, 1, 1)
    assert find(view, "b") is None
    assert view.last_seq == 2


def test_release_ends_the_lease_and_starts_the_cooldown() -> None:
    view = Log().add(1, acquired("a")).add(3, released("a", cooldown=5)).view()
    assert view.current is None
    record = find(view, "a")
    assert record is not None
    assert (record.end, record.ended_at) == (RELEASED, at(3))
    assert state_of(record, at(100)) == RELEASED
    assert view.cooldown_until == at(8)
    assert is_free(view, at(4))
    assert not is_available(view, at(7.9))
    assert is_available(view, at(8))
    assert available_at(view) == at(8)


def test_a_claim_during_cooldown_is_refused_and_after_it_granted() -> None:
    log = Log().add(1, acquired("a")).add(2, released("a", cooldown=5)).add(4, acquired("b"))
    assert log.view().rejected == 1
    view = log.add(7, acquired("c")).view()
    # The token is the grant's stream sequence: the refused claim took sequence 3, c has 4.
    assert (view.lease_id, view.fencing_token, view.granted) == ("c", 4, 2)


def test_expiry_without_an_event_is_settled_by_the_next_claim() -> None:
    view = Log().add(0, acquired("a", ttl=10, cooldown=2)).add(12, acquired("b")).view()
    assert view.lease_id == "b"
    assert view.fencing_token == 2
    old = find(view, "a")
    assert old is not None
    assert (old.end, old.ended_at) == (EXPIRED, at(10))
    # The cooldown counts from the end of the lease, not from when anyone noticed.
    assert Log().add(0, acquired("a", ttl=10, cooldown=3)).add(12, acquired("b")).view().rejected


def test_implicit_expiry_and_recorded_expiry_agree() -> None:
    implicit = Log().add(0, acquired("a", ttl=10, cooldown=2))
    assert available_at(implicit.view()) == at(12)
    recorded = (
        Log()
        .add(0, acquired("a", ttl=10, cooldown=2))
        .add(15, LeaseExpired(lease_id="a", proxy_uid="p1"))
    )
    view = recorded.view()
    assert view.current is None
    assert view.cooldown_until == at(12)
    record = find(view, "a")
    assert record is not None
    assert (record.end, record.ended_at) == (EXPIRED, at(10))


def test_premature_and_stale_expiry_is_ignored() -> None:
    early = Log().add(0, acquired("a", ttl=10)).add(5, LeaseExpired(lease_id="a", proxy_uid="p1"))
    assert early.view().lease_id == "a"  # a sweeper whose clock runs ahead changes nothing
    stale = (
        Log()
        .add(0, acquired("a", ttl=1))
        .add(2, acquired("b"))
        .add(3, LeaseExpired(lease_id="a", proxy_uid="p1"))
    )
    assert stale.view().lease_id == "b"


def test_release_after_the_end_counts_as_expiry() -> None:
    view = Log().add(0, acquired("a", ttl=10, cooldown=1)).add(20, released("a", cooldown=5)).view()
    record = find(view, "a")
    assert record is not None
    assert (record.end, record.ended_at) == (EXPIRED, at(10))
    assert view.cooldown_until == at(11)


def test_release_of_another_lease_is_ignored() -> None:
    view = Log().add(0, acquired("a")).add(1, released("zzz")).view()
    assert view.lease_id == "a"


def test_fencing_tokens_strictly_increase_over_grants_only() -> None:
    log = Log()
    for i in range(5):
        log.add(i * 10, acquired(f"l{i}", ttl=1)).add(i * 10 + 0.5, acquired(f"x{i}"))
    view = log.view()
    tokens = [r.fencing_token for r in view.recent] + [view.fencing_token]
    # Each is its grant's sequence; the refused claims in between are gaps, not tokens.
    assert tokens == [r.seq for r in view.recent] + [view.current.seq if view.current else 0]
    assert tokens == [1, 3, 5, 7, 9]
    assert (view.granted, view.rejected) == (5, 5)


def test_reports_are_kept_per_lease_and_per_proxy_bounded() -> None:
    log = Log().add(0, acquired("a")).add(1, released("a"))
    for i in range(HISTORY + 5):
        log.add(
            2 + i, LeaseReported(lease_id="a", proxy_uid="p1", outcome="success", detail=str(i))
        )
    log.add(100, acquired("b")).add(
        101, LeaseReported(lease_id="b", proxy_uid="p1", outcome="blocked")
    )
    view = log.view()
    assert len(view.outcomes) == HISTORY
    assert view.outcomes[-1].outcome == "blocked"
    a = find(view, "a")
    assert a is not None
    assert len(a.outcomes) == HISTORY
    assert a.outcomes[-1].detail == str(HISTORY + 4)
    assert view.current is not None
    assert [o.outcome for o in view.current.outcomes] == ["blocked"]


def test_history_is_bounded_and_the_index_follows_it() -> None:
    index: dict[str, str] = {}
    track = indexed(index)
    log = Log()
    for i in range(HISTORY + 3):
        log.add(i * 2, acquired(f"l{i}", ttl=1))
    view: LeaseView | None = None
    for recorded in log.events:
        view = track(view, recorded)
    assert view is not None
    assert len(view.recent) == HISTORY
    assert set(index) == {f"l{i}" for i in range(2, HISTORY + 3)}  # 20 ended + the current
    assert set(index.values()) == {"p1"}
    assert find(view, "l1") is None
    assert find(view, "l2") is not None


def test_only_the_current_lease_before_its_end_is_active() -> None:
    log = Log().add(0, acquired("a", ttl=10))
    view = log.view()
    assert active(view, "a", at(9.999)) is view.current
    assert active(view, "a", at(10)) is None  # past its end, recorded or not
    assert active(view, "b", at(1)) is None
    assert active(None, "a", at(1)) is None
    view = log.add(2, released("a")).view()
    assert find(view, "a") is not None  # the view still knows it...
    assert active(view, "a", at(3)) is None  # ...but it is over


def test_the_requested_ttl_and_the_report_target_are_kept() -> None:
    claim = LeaseAcquired(lease_id="a", proxy_uid="p1", ttl_seconds=60, requested_ttl_seconds=7200)
    report = LeaseReported(
        lease_id="a", proxy_uid="p1", outcome="blocked", target="shop.example", detail="403"
    )
    view = Log().add(0, claim).add(1, report).view()
    assert view.current is not None
    assert (view.current.ttl_seconds, view.current.requested_ttl_seconds) == (60, 7200)
    assert view.current.expires_at == at(60)
    (outcome,) = view.current.outcomes
    assert (outcome.outcome, outcome.target, outcome.detail, outcome.at) == (
        "blocked",
        "shop.example",
        "403",
        at(1),
    )


def test_other_events_only_advance_the_sequence() -> None:
    log = Log().add(0, acquired("a"))
    log.events.append(
        Recorded(event=HealthChanged(healthy=True), seq=2, subject="lease.p1", timestamp=at(1))
    )
    view = log.view()
    assert (view.lease_id, view.last_seq, view.updated_at) == ("a", 2, at(1))


@pytest.mark.parametrize("replay", [1, 2])
def test_rebuild_equals_incremental(replay: int) -> None:
    log = (
        Log()
        .add(0, acquired("a", ttl=5, cooldown=1))
        .add(1, acquired("b"))
        .add(2, released("a", cooldown=1))
    )
    log.add(4, acquired("c", ttl=2)).add(9, LeaseExpired(lease_id="c", proxy_uid="p1"))
    whole = fold(log.events)
    view: LeaseView | None = None
    for recorded in log.events:
        view = apply(view, recorded)
    assert view == whole
    assert fold(log.events[replay:], fold(log.events[:replay])) == whole
