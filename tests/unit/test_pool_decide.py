"""The pool controller's decider as stories over the pool fold (tests/support/pool_stories.py):
each decision appended as the controller appends it, the members' states set as the shared
views would show them, and the clock the story passes in. No servers. Scaling, the spread and
failed members here; recycling, rolling, deletion and the reasons in test_pool_decide_fresh."""

from __future__ import annotations

import random

import pytest

from events.customresource import cli_uid
from events.pool import (
    MAX_MEMBERS_PER_DECISION,
    MAX_REPLICAS,
    PoolDecided,
    PoolMember,
    SpreadEntry,
)
from events.poolresource import member_name
from projections.pool import FAILURE_MEMORY, fold
from services.pools.pure.decide import decide
from services.pools.pure.spread import next_provider, over_share, placements, shares
from tests.support.pool_stories import (
    NAME,
    NAMESPACE,
    UID,
    PoolStory,
    pool_spec,
    running,
    staggered,
)

# ------------------------------------------------------------------------------ scaling up


def test_a_pool_scaled_up_from_nothing_names_each_member_by_its_ordinal() -> None:
    story = PoolStory(pool_spec(3))
    decision = story.step()
    assert decision is not None
    assert (decision.reason, decision.message) == ("ScaleUp", "added 3 (0 -> 3 of 3)")
    assert [m.ordinal for m in decision.added] == [0, 1, 2]
    for member in decision.added:
        assert member.name == member_name(NAME, UID, member.ordinal)
        assert member.uid == cli_uid(NAMESPACE, member.name)  # as the CLI names a Proxy
        assert member.provider == "local"
    assert (decision.retired, decision.recycled, decision.rolled, decision.remove) == (
        (),
        (),
        (),
        False,
    )
    assert decision.figures.desired == 3
    assert decision.figures.members == 0
    # Level-triggered: the planned members count before their Proxies exist.
    assert story.decide() is None
    assert story.view.next_ordinal == 3


def test_a_scale_up_continues_after_the_highest_ordinal_ever_planned() -> None:
    story = running(pool_spec(2))
    story.scale(1)
    story.step()
    story.gone().scale(3)
    decision = story.step()
    assert decision is not None
    assert [m.ordinal for m in decision.added] == [2, 3]  # a retired ordinal is not reused
    assert len(story.active()) == 3


def test_deciding_twice_on_the_same_inputs_gives_the_same_decision() -> None:
    story = running(pool_spec(6, spread=[("a", 2), ("b", 1)], max_age=60, surge=2))
    story.failed(story.active()[0]).set(story.active()[3], leased=True).scale(4).wait(60)
    shuffled = dict(random.Random(7).sample(list(story.states.items()), len(story.states)))
    first = story.decide()
    assert first is not None
    assert first == story.decide() == decide(story.view, shuffled, story.now)


# ------------------------------------------------------------------------------ the spread


@pytest.mark.parametrize(
    ("total", "weights", "expected"),
    [
        pytest.param(20, {"a": 2, "b": 1}, {"a": 13, "b": 7}, id="20 over 2:1 is 13/7"),
        pytest.param(1, {"a": 1, "b": 1}, {"a": 1, "b": 0}, id="a tie goes to the first listed"),
        pytest.param(10, {"a": 1, "b": 1, "c": 1}, {"a": 4, "b": 3, "c": 3}, id="10 over 3"),
        pytest.param(0, {"a": 3, "b": 1}, {"a": 0, "b": 0}, id="none"),
        pytest.param(7, {"a": 1}, {"a": 7}, id="one provider"),
        pytest.param(3, {"a": 1, "b": 1000}, {"a": 0, "b": 3}, id="a small weight"),
        pytest.param(10_000, {"a": 1, "b": 2}, {"a": 3333, "b": 6667}, id="the most replicas"),
    ],
)
def test_shares_are_the_largest_remainders(
    total: int, weights: dict[str, int], expected: dict[str, int]
) -> None:
    entries = [SpreadEntry(provider=p, weight=w) for p, w in weights.items()]
    got = shares(total, entries)
    assert got == expected
    assert sum(got.values()) == total
    weight = sum(weights.values())
    assert all(abs(got[p] - total * w / weight) < 1 for p, w in weights.items())


def test_members_added_one_by_one_fill_the_shares_and_stay_within_one_of_them() -> None:
    entries = [SpreadEntry(provider="a", weight=2), SpreadEntry(provider="b", weight=1)]
    have: dict[str, int] = {}
    for _ in range(20):
        provider = next_provider(entries, have, 20)
        have[provider] = have.get(provider, 0) + 1
    assert have == {"a": 13, "b": 7}
    assert over_share(entries, have, 20) == []
    assert over_share(entries, {"a": 15, "b": 5, "gone": 2}, 20) == ["a", "gone"]


def test_a_pool_of_20_over_2_to_1_is_placed_13_and_7() -> None:
    story = PoolStory(pool_spec(20, spread=[("a", 2), ("b", 1)]))
    decision = story.step()
    assert decision is not None
    assert len(decision.added) == 20
    assert story.counts() == {"a": 13, "b": 7}


def test_a_changed_weight_moves_one_member_at_a_time_once_the_new_one_is_ready() -> None:
    """The rebalance adds where a provider is short; the surplus then comes off the provider over
    its share, and only once the new member is Ready: never the new member itself, which would
    be added again at the next evaluation, for ever."""
    story = running(pool_spec(2, spread=[("a", 1)]))
    story.change(pool_spec(2, spread=[("a", 1), ("b", 1)]))
    decision = story.step()
    assert decision is not None
    assert decision.reason == "Spread"
    assert [m.provider for m in decision.added] == ["b"]
    assert decision.message == "added 1 on b, to take over from a"
    assert story.decide() is None  # the new member is not Ready: nothing is retired yet
    story.run()
    decision = story.step()
    assert decision is not None
    assert decision.reason == "ScaleDown"
    assert [story.provider_of(uid) for uid in decision.retired] == ["a"]
    assert story.counts() == {"a": 1, "b": 1}
    assert story.gone().decide() is None


# ---------------------------------------------------------------------------- scaling down


def test_a_scale_down_retires_the_unhealthy_first_then_the_oldest_never_a_leased_one() -> None:
    story = staggered(5)
    m = story.active()
    story.set(m[3], healthy=False).set(m[0], leased=True).scale(3)
    decision = story.step()
    assert decision is not None
    assert decision.reason == "ScaleDown"
    assert decision.retired == (m[3], m[1])
    assert decision.message == "retired 2 (5 -> 3 of 3)"


def test_the_unready_go_before_the_ready_but_unhealthy() -> None:
    story = staggered(4)
    m = story.active()
    story.set(m[2], healthy=False).set(m[3], ready=False, phase="Provisioning").scale(2)
    decision = story.step()
    assert decision is not None
    assert decision.retired == (m[3], m[2])


def test_a_scale_down_whose_surplus_is_leased_says_what_waits() -> None:
    story = staggered(4)
    m = story.active()
    for uid in m[:3]:
        story.set(uid, leased=True)
    story.scale(2)
    decision = story.step()
    assert decision is not None
    assert decision.retired == (m[3],)
    assert "1 leased wait for their leases" in decision.message
    assert story.decide() is None  # the rest wait: nothing to decide
    assert story.view.replicas == 2
    story.set(m[0], leased=False)
    decision = story.step()
    assert decision is not None
    assert decision.retired == (m[0],)


def test_every_member_leased_nothing_is_retired() -> None:
    story = staggered(3)
    for uid in story.active():
        story.set(uid, leased=True)
    story.scale(0)
    assert story.decide() is None


@pytest.mark.parametrize(
    ("ready", "desired", "retired"),
    [
        pytest.param(3, 2, 1, id="3 Ready of 2 wanted: one goes"),
        pytest.param(2, 1, 2, id="2 Ready of 1 wanted, one pending: both surplus go"),
        pytest.param(1, 1, 2, id="1 Ready of 1 wanted: only the pending go"),
        pytest.param(0, 1, 2, id="none Ready: the surplus goes, the newest stays"),
        pytest.param(1, 0, 3, id="scaled to 0: all go"),
    ],
)
def test_a_ready_member_goes_only_while_more_are_ready_than_wanted(
    ready: int, desired: int, retired: int
) -> None:
    story = staggered(3)
    for uid in story.active()[ready:]:
        story.set(uid, ready=False, phase="Provisioning")
    story.scale(desired)
    decision = story.step()
    assert decision is not None
    assert len(decision.retired) == retired
    active = [story.states[uid] for uid in story.active()]
    assert sum(s.ready for s in active) == min(ready, max(desired, 0))


# ------------------------------------------------------------------------ failed members


def test_a_failed_member_is_replaced_away_from_its_provider() -> None:
    """Retired and replaced in one decision: the replacement goes elsewhere although the
    failure is only in the view once the decision is folded."""
    story = running(pool_spec(2, spread=[("a", 1), ("b", 1)]))
    on_b = next(uid for uid in story.active() if story.provider_of(uid) == "b")
    story.failed(on_b)
    decision = story.step()
    assert decision is not None
    assert (decision.reason, decision.retired) == ("Failed", (on_b,))
    assert [m.provider for m in decision.added] == ["a"]
    assert decision.message == "retired 1 failed on b; added 1 (1 -> 2 of 2), avoiding b"
    assert story.view.failing(story.now) == frozenset({"b"})
    story.gone().run().scale(4)
    decision = story.step()
    assert decision is not None
    assert [m.provider for m in decision.added] == ["a", "a"]
    assert decision.message == "added 2 (2 -> 4 of 4), avoiding b"


def test_a_failed_provider_is_tried_again_after_the_failure_memory() -> None:
    story = running(pool_spec(2, spread=[("a", 1), ("b", 1)]))
    on_b = next(uid for uid in story.active() if story.provider_of(uid) == "b")
    story.failed(on_b).step()
    story.gone().run().wait(FAILURE_MEMORY.total_seconds() - 1)
    assert story.decide() is None
    story.wait(1)
    decision = story.step()
    assert decision is not None
    assert decision.reason == "Spread"
    assert [m.provider for m in decision.added] == ["b"]


def test_when_every_provider_failed_a_pool_keeps_trying_on_all() -> None:
    story = running(pool_spec(1))
    (uid,) = story.active()
    story.failed(uid)
    decision = story.step()
    assert decision is not None
    assert decision.retired == (uid,)
    assert [m.provider for m in decision.added] == ["local"]
    assert "avoiding" not in decision.message
    assert placements(story.view, story.now)[1] == []


def test_a_leased_failed_member_waits_for_its_lease() -> None:
    story = running(pool_spec(2))
    uid = story.active()[0]
    story.failed(uid).set(uid, leased=True)
    assert story.decide() is None


def test_a_failed_decision_retires_only_the_failed() -> None:
    """The fold takes the provider of every member a ``Failed`` decision retires as failing: a
    scale-down in the same decision would have a healthy provider avoided for ten minutes."""
    story = running(pool_spec(4, spread=[("a", 1), ("b", 1), ("c", 1)]))
    assert story.counts() == {"a": 2, "b": 1, "c": 1}
    on_c = next(uid for uid in story.active() if story.provider_of(uid) == "c")
    story.failed(on_c).scale(2)
    decision = story.step()
    assert decision is not None
    assert (decision.reason, decision.retired, decision.added) == ("Failed", (on_c,), ())
    assert story.view.failing(story.now) == frozenset({"c"})
    decision = story.step()
    assert decision is not None
    assert decision.reason == "ScaleDown"
    assert [story.provider_of(uid) for uid in decision.retired] == ["a"]
    assert story.view.failing(story.now) == frozenset({"c"})


# ------------------------------------------------------------------------- big pools


def test_a_pool_of_the_most_replicas_grows_in_bounded_steps_with_distinct_names() -> None:
    story = PoolStory(pool_spec(MAX_REPLICAS))
    steps = 0
    while (decision := story.step()) is not None:
        assert len(decision.added) <= MAX_MEMBERS_PER_DECISION
        steps += 1
        assert steps <= MAX_REPLICAS // MAX_MEMBERS_PER_DECISION
    view = story.view
    assert steps == MAX_REPLICAS // MAX_MEMBERS_PER_DECISION
    assert (len(view.active()), view.unusable) == (MAX_REPLICAS, 0)
    assert len({p.member.name for p in view.active()}) == MAX_REPLICAS
    assert view == fold(story.events)


def collision() -> tuple[int, int]:
    """Two ordinals of the story's pool whose member names are alike (5 characters hold 27**5
    names: about 4 of 10,000 ordinals meet an earlier one)."""
    seen: dict[str, int] = {}
    for ordinal in range(100_000):
        name = member_name(NAME, UID, ordinal)
        if name in seen:
            return seen[name], ordinal
        seen[name] = ordinal
    raise AssertionError("no two member names alike")


def test_an_ordinal_whose_name_a_member_has_is_skipped() -> None:
    """Else the fold refuses the second member of that uid, the pool stays one short, and every
    evaluation plans the same ordinal again."""
    first, second = collision()
    story = PoolStory(pool_spec(3))
    # The pool's history brought it to the ordinal whose name the first of the pair has.
    story.add(PoolDecided(uid=UID, reason="ScaleUp", added=(_member(first), _member(second - 1))))
    assert story.view.next_ordinal == second
    decision = story.step()
    assert decision is not None
    assert [m.ordinal for m in decision.added] == [second + 1]
    assert story.view.unusable == 0
    assert len(story.active()) == 3
    assert story.decide() is None


def _member(ordinal: int) -> PoolMember:
    name = member_name(NAME, UID, ordinal)
    return PoolMember(ordinal=ordinal, name=name, uid=cli_uid(NAMESPACE, name), provider="local")
