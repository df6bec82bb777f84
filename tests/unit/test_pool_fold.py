"""The pool fold (``projections.pool``) over recorded events, without servers: what a pool asks
for and which members its controller planned, and, since the log is trusted for nothing, what it
makes of events no writer of this version would append."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.pool import (
    MAX_REPLICAS,
    PoolDecided,
    PoolDeclared,
    PoolDeletionRequested,
    PoolMember,
    PoolRemoved,
    PoolScaled,
    PoolSpec,
    PoolSpecChanged,
    SpreadEntry,
)
from events.reading import apply_tolerantly
from events.schemas import Event, ProxyMode, ProxySpec
from events.skips import UNDECODABLE
from events.store import Recorded, Unreadable
from projections.pool import FAILURE_MEMORY, MAX_ORDINAL, Undeclared, apply, fold, usable_spec
from projections.pool_members import MemberState
from services.pools.pure.decide import decide
from tests.support.pool_stories import NAME, NAMESPACE, T0, UID, PoolStory, pool_spec

SPEC = pool_spec(2)


def member(
    ordinal: int, name: str | None = None, uid: str | None = None, provider: str = "local"
) -> PoolMember:
    return PoolMember(
        ordinal=ordinal,
        name=f"de-m{ordinal}" if name is None else name,
        uid=f"uid-{ordinal}" if uid is None else uid,
        provider=provider,
    )


def added(*members: PoolMember, reason: str = "ScaleUp") -> PoolDecided:
    return PoolDecided(uid=UID, reason=reason, added=members)


def declared(spec: PoolSpec = SPEC) -> PoolDeclared:
    return PoolDeclared(uid=UID, namespace=NAMESPACE, name=NAME, spec=spec, source="kubernetes")


# ------------------------------------------------------------------------------ the life


def test_a_declaration_gives_the_pool_its_spec_and_replicas() -> None:
    story = PoolStory(SPEC)
    view = story.view
    assert (view.uid, view.namespace, view.name, view.source) == (UID, NAMESPACE, NAME, "cli")
    assert (view.spec, view.replicas, view.generation) == (SPEC, 2, 1)
    assert (view.created_at, view.updated_at, view.last_seq) == (T0, T0, 1)
    assert (view.members, view.next_ordinal, view.decisions, view.unusable) == ({}, 0, 0, 0)
    assert not view.deleting
    assert not view.removed


def test_a_decision_plants_its_members_at_the_pools_generation() -> None:
    story = PoolStory(SPEC).wait(5)
    story.add(added(member(0), member(1)))
    view = story.view
    assert [p.member.uid for p in view.active()] == ["uid-0", "uid-1"]
    assert all(p.planned_at == T0 + timedelta(seconds=5) for p in view.active())
    assert all(p.generation == 1 and p.retired_at is None for p in view.active())
    assert (view.next_ordinal, view.decisions, view.decided_at) == (2, 1, story.now)
    assert view.last_decision == added(member(0), member(1))
    assert view.retired() == []


def test_a_retired_member_is_kept_apart_until_the_pool_is_removed() -> None:
    story = PoolStory(SPEC).add(added(member(0), member(1))).wait(5)
    story.add(PoolDecided(uid=UID, reason="ScaleDown", retired=("uid-0",)))
    view = story.view
    assert [p.member.uid for p in view.active()] == ["uid-1"]
    assert [(p.member.uid, p.retired_at) for p in view.retired()] == [("uid-0", story.now)]
    assert view.failures == {}  # a scale-down is no failure
    story.add(PoolDecided(uid=UID, reason="ScaleDown", retired=("uid-0",))).wait(5)
    assert story.view.retired()[0].retired_at == T0 + timedelta(seconds=5)  # the first stands


def test_a_member_retired_as_failed_has_its_provider_avoided_for_a_while() -> None:
    story = PoolStory(SPEC).add(added(member(0, provider="a"), member(1, provider="b")))
    story.add(PoolDecided(uid=UID, reason="Failed", retired=("uid-1",)))
    view = story.view
    assert view.failures == {"b": T0}
    assert view.failing(T0 + FAILURE_MEMORY - timedelta(seconds=1)) == frozenset({"b"})
    assert view.failing(T0 + FAILURE_MEMORY) == frozenset()


def test_a_rolled_member_takes_the_pools_current_generation() -> None:
    story = PoolStory(SPEC).add(added(member(0), member(1), member(2)))
    story.add(PoolDecided(uid=UID, reason="ScaleDown", retired=("uid-2",)))
    story.change(pool_spec(3, attributes={"tier": "gold"}))
    story.add(PoolDecided(uid=UID, reason="Template", rolled=("uid-0", "uid-2", "nobody")))
    generations = {uid: p.generation for uid, p in story.view.members.items()}
    assert generations == {"uid-0": 2, "uid-1": 1, "uid-2": 1}  # a retired member stays as it was


def test_a_scale_changes_the_count_until_the_spec_changes() -> None:
    story = PoolStory(SPEC).scale(5)
    assert (story.view.replicas, story.view.spec.replicas) == (5, 2)
    story.change(pool_spec(3, attributes={"tier": "gold"}))
    view = story.view
    assert (view.replicas, view.generation, view.spec) == (3, 2, story.spec)
    story.scale(0)
    assert story.view.replicas == 0


def test_deletion_then_removal_ends_the_pool_and_a_new_declaration_starts_afresh() -> None:
    story = PoolStory(SPEC).add(added(member(0))).delete()
    assert story.view.deleting
    story.add(PoolDecided(uid=UID, reason="Deleting", retired=("uid-0",)), PoolRemoved(uid=UID))
    view = story.view
    assert (view.removed, view.deleting, view.members) == (True, False, {})
    assert decide(view, {}, story.now) is None
    story.wait(60).add(declared(pool_spec(1)))
    view = story.view
    assert (view.removed, view.replicas, view.next_ordinal, view.source) == (
        False,
        1,
        0,
        "kubernetes",
    )
    assert view.created_at == story.now


def test_a_second_declaration_of_a_live_pool_changes_nothing_but_its_sequence() -> None:
    story = PoolStory(SPEC).add(added(member(0))).add(declared(pool_spec(7)))
    view = story.view
    assert (view.spec, view.replicas, view.source, view.last_seq) == (SPEC, 2, "cli", 3)
    assert len(view.active()) == 1


def test_the_fold_of_a_story_is_its_events_applied_one_by_one() -> None:
    story = PoolStory(SPEC).add(added(member(0), member(1))).scale(1).delete()
    view = None
    for recorded in story.events:
        view = apply(view, recorded)
    assert view == fold(story.events) == story.view


# ------------------------------------------------------------------------- hostile events


def recorded(event: Event | Unreadable, seq: int = 1) -> Recorded:
    return Recorded(event, seq, f"pool.{UID}.declared", T0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "event",
    [
        PoolScaled(uid=UID, replicas=3),
        PoolSpecChanged(uid=UID, spec=SPEC, generation=2),
        PoolDeletionRequested(uid=UID),
        PoolRemoved(uid=UID),
        added(member(0)),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_event_before_the_declaration_is_undeclared_and_skipped_by_the_fold(
    event: Event,
) -> None:
    with pytest.raises(Undeclared, match=f"{type(event).__name__} on pool"):
        apply(None, recorded(event))
    assert fold([recorded(event)]) is None
    view = fold([recorded(event), recorded(declared(), seq=2)])
    assert view is not None
    assert (view.replicas, view.members, view.deleting, view.last_seq) == (2, {}, False, 2)


@pytest.mark.parametrize(
    "bad",
    [
        member(0, name="De-Upper"),
        member(0, name="x" * 64),
        member(0, name="-de"),
        member(0, name=""),
        member(0, uid="a.b"),
        member(0, uid="a*"),
        member(0, uid="u" * 129),
        member(0, uid=""),
        member(0, provider=""),
        member(0, provider="no such"),
        member(-1),
        member(MAX_ORDINAL),
    ],
    ids=[
        "upper-case name",
        "64-char name",
        "leading dash",
        "no name",
        "dotted uid",
        "wildcard uid",
        "long uid",
        "no uid",
        "no provider",
        "spaced provider",
        "ordinal -1",
        "ordinal too big",
    ],
)
def test_a_member_that_could_never_be_a_proxy_is_counted_and_not_planted(bad: PoolMember) -> None:
    story = PoolStory(SPEC).add(added(bad, member(1)))
    view = story.view
    assert list(view.members) == ["uid-1"]
    assert (view.unusable, view.next_ordinal, view.decisions) == (1, 2, 1)


def test_a_member_uid_planned_twice_keeps_the_first() -> None:
    story = PoolStory(SPEC).add(added(member(0), member(1, uid="uid-0")))
    story.add(added(member(2, uid="uid-0", provider="other")))
    view = story.view
    assert list(view.members) == ["uid-0"]
    assert view.members["uid-0"].member == member(0)
    assert (view.unusable, view.next_ordinal) == (2, 1)


@pytest.mark.parametrize("replicas", [-1, MAX_REPLICAS + 1, 10**9])
def test_a_scale_out_of_range_is_counted_and_changes_nothing(replicas: int) -> None:
    story = PoolStory(SPEC).scale(replicas)
    view = story.view
    assert (view.replicas, view.unusable, view.last_seq) == (2, 1, 2)


def test_an_unreadable_event_is_passed_over() -> None:
    story = PoolStory(SPEC)
    story.add(added(member(0)))
    unreadable = Unreadable(type="PoolDecided", reason=UNDECODABLE, detail="bad json")
    before = story.view
    after = apply(before, recorded(unreadable, seq=3))
    assert (after.members, after.replicas, after.decisions) == (before.members, 2, 1)
    view, skip = apply_tolerantly(apply, before, recorded(unreadable, seq=3), "POOL")
    assert (view, skip) == (after, None)
    view, skip = apply_tolerantly(apply, None, recorded(unreadable), "POOL")
    assert view is None
    assert skip is not None


HOSTILE_SPECS = [
    pytest.param(pool_spec(2, spread=[("a", 0)]), id="weight 0"),
    pytest.param(pool_spec(2, spread=[("a", -1), ("b", 1)]), id="negative weight"),
    pytest.param(pool_spec(2, spread=[("a", 1), ("a", 2)]), id="a provider twice"),
    pytest.param(pool_spec(2, spread=[("no such", 1)]), id="a provider no name"),
    pytest.param(pool_spec(2, spread=[(f"p{i}", 1) for i in range(17)]), id="17 providers"),
    pytest.param(pool_spec(2, surge=0), id="maxSurge 0"),
    pytest.param(pool_spec(2, surge=-3), id="maxSurge -3"),
    pytest.param(pool_spec(2, max_age=-5), id="maxAge -5"),
    pytest.param(pool_spec(2, max_age=math.nan), id="maxAge nan"),
    pytest.param(pool_spec(2, max_age=math.inf), id="maxAge inf"),
    pytest.param(pool_spec(2, max_age=1), id="maxAge 1s"),
    pytest.param(pool_spec(2, blocks=-1), id="recycleOnBlocks -1"),
    pytest.param(pool_spec(-1), id="replicas -1"),
    pytest.param(pool_spec(10**9), id="replicas 10^9"),
    pytest.param(pool_spec(2, provider=""), id="no provider"),
    pytest.param(
        PoolSpec(replicas=2, template=ProxySpec(mode=ProxyMode.EXTERNAL, provider="local")),
        id="External",
    ),
]


@pytest.mark.parametrize("spec", HOSTILE_SPECS)
def test_a_spec_the_decider_cannot_use_is_counted_and_not_taken(spec: PoolSpec) -> None:
    """A weight of 0 divides by zero, a negative maxAge or recycleOnBlocks recycles every member
    at every evaluation, a pool with no provider plans members the fold then refuses, for ever:
    such a spec, written before the resource refused it or straight to the subject, is left."""
    assert not usable_spec(spec)
    good = pool_spec(2, spread=[("a", 1), ("b", 1)], max_age=60, blocks=3, surge=2)
    story = PoolStory(good)
    story.step()
    story.run().wait(3600)
    story.add(PoolSpecChanged(uid=UID, spec=spec, generation=2))
    view = story.view
    assert (view.spec, view.generation, view.unusable) == (good, 1, 1)
    decision = story.decide()
    assert decision is not None
    assert decision.recycled  # the pool goes on under the spec it had

    fresh = PoolStory(spec)
    view = fresh.view
    assert (view.spec, view.replicas, view.unusable) == (PoolSpec(), 0, 1)
    assert fresh.scale(3).view.replicas == 0  # no provider to place 3 on
    assert fresh.view.unusable == 2
    assert fresh.decide() is None


def test_the_specs_of_the_stories_are_usable() -> None:
    for spec in (
        SPEC,
        pool_spec(0),
        pool_spec(MAX_REPLICAS, spread=[(f"p{i}", 1000) for i in range(16)]),
        pool_spec(2, max_age=10, blocks=1000, surge=100),
        pool_spec(2, max_age=365 * 24 * 3600),
    ):
        assert usable_spec(spec), spec


# ------------------------------------------------------------------ whatever the log holds

names = st.text(alphabet="abz09-.*Z ", max_size=8)
integers = st.one_of(st.integers(-3, 12), st.sampled_from([-(10**9), 10**9, MAX_ORDINAL]))
members = st.builds(PoolMember, ordinal=integers, name=names, uid=names, provider=names)
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 60.0]))
specs = st.builds(
    PoolSpec,
    replicas=integers,
    template=st.builds(ProxySpec, provider=names),
    spread=st.lists(st.builds(SpreadEntry, provider=names, weight=integers), max_size=3).map(tuple),
    max_age_seconds=floats,
    recycle_on_blocks=integers,
    max_surge=integers,
)
events = st.one_of(
    st.builds(PoolDeclared, uid=st.just(UID), namespace=names, name=names, spec=specs),
    st.builds(PoolSpecChanged, uid=st.just(UID), spec=specs, generation=integers),
    st.builds(PoolScaled, uid=st.just(UID), replicas=integers),
    st.builds(PoolDeletionRequested, uid=st.just(UID)),
    st.builds(PoolRemoved, uid=st.just(UID)),
    st.builds(
        PoolDecided,
        uid=st.just(UID),
        reason=st.sampled_from(["ScaleUp", "Failed", "ScaleDown", "x"]),
        added=st.lists(members, max_size=4).map(tuple),
        retired=st.lists(names, max_size=3).map(tuple),
        rolled=st.lists(names, max_size=3).map(tuple),
    ),
    st.builds(Unreadable, type=names, reason=st.just(UNDECODABLE), detail=names),
)
states = st.builds(
    MemberState,
    uid=names,
    declared=st.booleans(),
    ready=st.booleans(),
    healthy=st.booleans(),
    leased=st.booleans(),
    rotating=st.booleans(),
    failed=st.booleans(),
    blocked_targets=integers,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=12), st.lists(states, max_size=6), st.integers(0, 10**6))
def test_any_log_folds_and_the_decider_decides_on_it(
    log: list[Event | Unreadable], member_states: list[MemberState], seconds: int
) -> None:
    """Folded as every reader folds (``apply_tolerantly``), whatever the events hold; and the
    decider, level-triggered on that view, neither raises nor plans a member the fold refuses."""
    items = [
        Recorded(event, seq, f"pool.{UID}.declared", T0 + timedelta(seconds=seq))  # type: ignore[arg-type]
        for seq, event in enumerate(log, 1)
    ]
    view = None
    for item in items:
        view, _ = apply_tolerantly(apply, view, item, "POOL")
    assert fold(items) == view  # the fold never needs the tolerance
    if view is None:
        assert not any(isinstance(e, PoolDeclared) for e in log)
        return
    known = [p.member.uid for p in view.members.values()]
    pairs = zip(known, member_states, strict=False)
    by_uid = {uid: msgspec.structs.replace(s, uid=uid) for uid, s in pairs}
    decision = decide(view, by_uid, T0 + timedelta(seconds=seconds))
    if decision is None or decision.remove:
        return
    event = PoolDecided(uid=UID, reason=decision.reason, added=decision.added)
    after = apply(view, Recorded(event, 99, f"pool.{UID}.decision", T0))
    assert after.unusable == view.unusable
    assert len(after.active()) == len(view.active()) + len(decision.added)


@pytest.mark.parametrize("uid", ["a b", "x.>", "", "other-pool"])
def test_a_declaration_whose_uid_is_not_its_subjects_is_skipped(uid: str) -> None:
    """The uid names the pool's subjects, members and demand: a hand-written PoolDeclared
    carrying another (or one no subject can hold) is no pool."""
    event = PoolDeclared(uid=uid, namespace="ns", name="de", spec=PoolSpec(replicas=1))
    recorded = Recorded(event, 1, "pool.pool-1.declared", datetime(2026, 1, 1, tzinfo=UTC))
    view, skip = apply_tolerantly(apply, None, recorded, "POOL")
    assert view is None
    assert skip is not None
