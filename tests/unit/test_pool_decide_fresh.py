"""The pool controller's decider keeping members fresh and ending the pool, as stories over the
pool fold (tests/support/pool_stories.py): maxAge and blocks recycled, a template rolled, all
within maxSurge; a deleted pool retired then removed; the reason each decision gives."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.pools.pure.decide import REASONS
from tests.support.pool_stories import PoolStory, pool_spec, running, staggered

# ------------------------------------------------------------------ maxAge and blocks


def test_members_past_max_age_are_recycled_at_most_max_surge_at_once() -> None:
    story = staggered(4)
    story.change(pool_spec(4, max_age=3600, surge=2))
    m = story.active()
    assert story.decide() is None
    story.wait(3600 - 4 * 60)
    decision = story.step()
    assert decision is not None
    assert (decision.reason, decision.recycled) == ("MaxAge", (m[0],))  # the only one aged yet
    story.wait(120)
    story.set(m[0], rotating=True)
    decision = story.step()
    assert decision is not None
    assert decision.recycled == (m[1],)  # maxSurge 2, one rotating already
    story.set(m[1], rotating=True)
    assert story.decide() is None
    story.set(m[0], rotating=False, since=story.now)  # a fresh instance: young again
    decision = story.step()
    assert decision is not None
    assert decision.recycled == (m[2],)


def test_the_oldest_are_recycled_first() -> None:
    story = staggered(4)
    story.change(pool_spec(4, max_age=60, surge=2))
    m = story.active()
    decision = story.step()
    assert decision is not None
    assert decision.recycled == (m[0], m[1])
    assert decision.message == "recycled 2 past maxAge"


def test_a_member_blocked_by_enough_targets_is_recycled_before_an_aged_one() -> None:
    story = staggered(3)
    story.change(pool_spec(3, max_age=60, blocks=3, surge=1))
    m = story.active()
    story.set(m[2], blocked_targets=3).set(m[1], blocked_targets=2)
    decision = story.step()
    assert decision is not None
    assert decision.recycled == (m[2],)
    assert decision.reason == "Blocked"
    story.set(m[2], rotating=True)
    assert story.decide() is None  # maxSurge 1: one at a time


@pytest.mark.parametrize(
    "state",
    [
        {"ready": False, "phase": "Provisioning"},
        {"rotating": True},
        {"deleting": True},
        {"declared": False},
    ],
    ids=["not Ready", "rotating", "deleting", "no Proxy"],
)
def test_only_a_ready_settled_member_is_recycled(state: dict[str, object]) -> None:
    story = staggered(1)
    story.change(pool_spec(1, max_age=60, blocks=1, surge=5))
    (uid,) = story.active()
    story.set(uid, blocked_targets=5, **state)
    assert story.decide() is None


def test_a_leased_member_is_recycled_by_rotation_not_retired() -> None:
    story = staggered(1)
    story.change(pool_spec(1, max_age=60))
    (uid,) = story.active()
    story.set(uid, leased=True)
    decision = story.step()
    assert decision is not None
    assert (decision.recycled, decision.retired) == ((uid,), ())


# -------------------------------------------------------------------------- the template


def changed_template(replicas: int = 4, surge: int = 1) -> PoolStory:
    story = running(pool_spec(replicas, surge=surge))
    story.change(pool_spec(replicas, surge=surge, attributes={"country": "de", "tier": "gold"}))
    return story


def test_a_template_change_rolls_at_most_max_surge_members_at_once() -> None:
    story = changed_template(4, surge=1)
    m = story.active()
    decision = story.step()
    assert decision is not None
    assert (decision.reason, decision.rolled) == ("Template", (m[0],))
    assert decision.message == "rolled 1 to generation 2"
    assert story.planned(m[0]).generation == 2
    # The controller declares it again; the reconciler replaces it make-before-break.
    story.states.pop(m[0])
    story.run(m[0]).set(m[0], rotating=True)
    assert story.decide() is None
    story.set(m[0], rotating=False)
    decision = story.step()
    assert decision is not None
    assert decision.rolled == (m[1],)


def test_members_not_ready_count_against_max_surge() -> None:
    story = changed_template(4, surge=2)
    m = story.active()
    story.set(m[3], ready=False, phase="Provisioning")
    decision = story.step()
    assert decision is not None
    assert decision.rolled == (m[0],)


def test_a_rolled_member_is_busy_until_its_proxy_shows_the_new_spec_reconciled() -> None:
    """Between the roll and the reconciler's answer the member is Ready, not rotating: without
    counting it busy, the next evaluation would roll another and exceed maxSurge."""
    story = changed_template(3, surge=1)
    m = story.active()
    decision = story.step()
    assert decision is not None
    assert decision.rolled == (m[0],)
    assert story.decide() is None  # its Proxy still shows the old spec: the roll is under way
    story.states.pop(m[0])
    story.run(m[0]).set(m[0], settling=True)  # re-declared, not yet reconciled
    assert story.decide() is None
    story.set(m[0], settling=False)
    decision = story.step()
    assert decision is not None
    assert decision.rolled == (m[1],)


def test_a_spec_change_that_leaves_the_members_spec_rolls_nothing() -> None:
    story = running(pool_spec(2))
    story.change(pool_spec(3))
    decision = story.step()
    assert decision is not None
    assert (decision.reason, decision.rolled) == ("ScaleUp", ())


def test_members_of_the_current_generation_are_not_rolled() -> None:
    story = changed_template(2, surge=2)
    m = story.active()
    story.step()
    assert story.planned(m[0]).generation == 2
    assert story.decide() is None  # their Proxies still hold the old spec: rolled already


# ------------------------------------------------------------------------------- deletion


def test_deletion_retires_every_member_then_removes_the_pool() -> None:
    story = running(pool_spec(3))
    m = story.active()
    story.set(m[0], leased=True).delete()
    decision = story.step()
    assert decision is not None
    assert (decision.reason, decision.retired, decision.remove) == ("Deleting", tuple(m), False)
    assert story.decide() is None  # their Proxies are still being deleted
    story.gone()
    decision = story.step()
    assert decision is not None
    assert (decision.reason, decision.remove) == ("Deleting", True)
    assert story.view.removed
    assert story.decide() is None


def test_a_pool_deleted_before_any_member_is_declared_is_removed_at_once() -> None:
    story = PoolStory(pool_spec(2))
    story.step()
    story.delete()
    decision = story.step()
    assert decision is not None
    assert decision.retired == tuple(p.member.uid for p in story.view.retired())
    decision = story.step()
    assert decision is not None
    assert decision.remove


# -------------------------------------------------------------------------- the reasons


def test_the_reasons_are_in_the_documented_order() -> None:
    assert REASONS == (
        "Deleting",
        "Failed",
        "Autoscale",
        "ScaleUp",
        "ScaleDown",
        "Spread",
        "MaxAge",
        "Blocked",
        "Template",
        "Pressure",
    )


def failed_and_short() -> PoolStory:
    story = running(pool_spec(2))
    return story.failed(story.active()[0]).scale(3)


def short_and_aged() -> PoolStory:
    story = staggered(2)
    return story.change(pool_spec(3, max_age=60, surge=1))


def aged_and_blocked() -> PoolStory:
    story = staggered(2)
    story.change(pool_spec(2, max_age=60, blocks=1, surge=2))
    return story.set(story.active()[1], blocked_targets=1)


def aged_and_changed() -> PoolStory:
    story = staggered(3)  # Ready for 180, 120 and 60 s
    return story.change(pool_spec(3, max_age=100, surge=3, attributes={"tier": "gold"}))


@pytest.mark.parametrize(
    ("build", "reason", "parts"),
    [
        pytest.param(failed_and_short, "Failed", ["retired 1 failed", "added 2"], id="Failed"),
        pytest.param(short_and_aged, "ScaleUp", ["added 1", "recycled 1"], id="ScaleUp"),
        pytest.param(
            aged_and_blocked,
            "MaxAge",
            ["recycled 1 blocked", "recycled 1 past maxAge"],
            id="MaxAge before Blocked",
        ),
        pytest.param(
            aged_and_changed, "MaxAge", ["recycled 2 past", "rolled 1"], id="MaxAge+Template"
        ),
    ],
)
def test_a_decision_is_given_the_first_reason_it_did(
    build: Callable[[], PoolStory], reason: str, parts: list[str]
) -> None:
    decision = build().decide()
    assert decision is not None
    assert decision.reason == reason
    notes = decision.message.split("; ")
    assert len(notes) == len(parts)
    assert all(note.startswith(part) for note, part in zip(notes, parts, strict=True)), notes
