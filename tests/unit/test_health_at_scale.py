"""What a health replica does per proxy stays per proxy at 10^5 (docs/benchmarks.md, "Scale"):
who owns a proxy is hashed once per membership, and forgetting a proxy's egress checks does
not scan every other proxy's."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from services.health import assign
from services.health.assign import Membership, owner
from services.health.egress import EgressChecker, EgressSettings
from services.health.metrics import HealthMetrics
from services.runtime.eventlog.memory import InMemoryEventStore

KEYS = [f"px-{i}" for i in range(200)]


def test_ownership_is_remembered_per_membership_and_recomputed_when_it_changes() -> None:
    member = Membership(None, "a")  # type: ignore[arg-type] # no JetStream: nothing is read
    member._publish(("a", "b"))
    first = {k: member.owns(k) for k in KEYS}
    assert first == {k: owner(k, ("a", "b")) == "a" for k in KEYS}
    assert 0 < sum(first.values()) < len(KEYS), "one of two members owns only a share"
    member.members = ("a", "b", "c")  # changed behind its back: the cache still answers
    assert {k: member.owns(k) for k in KEYS} == first
    member._publish(("a",))
    assert all(member.owns(k) for k in KEYS)
    member._publish(())
    assert not any(member.owns(k) for k in KEYS)


def test_ownership_remembers_a_bounded_number_of_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assign, "MAX_OWNED", 10)
    member = Membership(None, "a")  # type: ignore[arg-type]
    member._publish(("a", "b"))
    answers = [member.owns(k) for k in KEYS]
    assert len(member._owned) <= 10
    assert answers == [owner(k, ("a", "b")) == "a" for k in KEYS]


def test_forgetting_one_proxy_keeps_the_others_checks() -> None:
    checker = EgressChecker(
        InMemoryEventStore(),
        None,  # type: ignore[arg-type] # no check runs here
        lambda: None,  # type: ignore[arg-type,return-value]
        EgressSettings(),
        HealthMetrics(CollectorRegistry()),
        clock=lambda: datetime(2026, 12, 7, tzinfo=UTC),
    )
    for uid in ("px-1", "px-2"):
        for provider_id in ("i-old", "i-new"):
            checker.checked.setdefault(uid, {})[provider_id] = checker.clock()
    checker.stop("px-1")
    checker.stop("px-gone")
    assert checker.checked == {"px-2": {"i-old": checker.clock(), "i-new": checker.clock()}}
