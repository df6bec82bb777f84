"""An autoscaled pool's stories (``services.pools.pure.autoscale`` through ``decide``): the load
turns, is recorded, holds for ``scaleUpAfter``/``scaleDownAfter``, and only then changes the size,
within ``min``..``max``, never taking a leased member; and the bounds against a hostile log."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.pool import Autoscale, PoolDecided, PoolPressure, PoolSpec
from projections.pool_demand import Demand
from tests.support.pool_stories import UID, PoolStory, pool_spec

UP, DOWN = 30.0, 600.0


def autoscaled(min_: int = 2, max_: int = 10, target: float = 1.0, replicas: int = 0) -> PoolSpec:
    return msgspec.structs.replace(
        pool_spec(replicas),
        autoscale=Autoscale(
            min=min_,
            max=max_,
            target_leased=target,
            scale_up_after_seconds=UP,
            scale_down_after_seconds=DOWN,
        ),
    )


def settled(spec: PoolSpec) -> PoolStory:
    """Declared, held within its bounds, every member Ready and healthy, nothing to do now
    (an idle pool above its minimum has its load turned down)."""
    story = PoolStory(spec)
    while (decision := story.step()) is not None:
        assert decision.reason in ("Autoscale", "ScaleUp", "Pressure"), decision
        story.run()
    assert story.decide() is None
    return story


def lease(story: PoolStory, count: int) -> PoolStory:
    for uid in story.active()[:count]:
        story.set(uid, leased=True)
    return story


def test_an_autoscaled_pool_starts_at_its_minimum() -> None:
    story = PoolStory(autoscaled(min_=3))
    decision = story.step()
    assert decision is not None
    assert decision.reason == "Autoscale"
    assert decision.scaled_to == 3
    assert len(decision.added) == 3
    assert "held within 3..10 (0 -> 3)" in decision.message
    assert story.view.replicas == 3


def test_waiting_crawlers_turn_the_load_up_then_scale_after_scale_up_after() -> None:
    story = lease(settled(autoscaled()), 2)
    story.demand = Demand(waiting=5, refused={"busy": 4}, unserved=6)
    turned = story.step()
    assert turned is not None
    assert turned.reason == "Pressure"
    assert turned.pressure == "up"
    assert turned.wanted == 8  # 2 leased + 6 unserved, at a target of 1.0
    assert not turned.added
    assert turned.figures.waiting == 5
    assert turned.figures.refused == {"busy": 4}
    assert story.view.pressure == "up"
    assert story.events[-1].event == PoolPressure(
        uid=UID, pressure="up", wanted=8, figures=turned.figures
    )
    assert story.wait(UP - 1).decide() is None  # not held long enough
    scaled = story.wait(1).step()
    assert scaled is not None
    assert scaled.reason == "Autoscale"
    assert scaled.scaled_to == 8
    assert len(scaled.added) == 6
    assert "up for 30s: 2 -> 8" in scaled.message
    assert "6 unserved (5 waiting)" in scaled.message
    assert isinstance(story.events[-1].event, PoolDecided)
    assert story.view.replicas == 8
    assert story.view.pressure == "steady"  # the count starts again


def test_the_count_starts_again_after_a_scale() -> None:
    story = lease(settled(autoscaled()), 2)
    story.demand = Demand(unserved=3)
    story.step()
    story.wait(UP).step()  # 2 -> 5
    assert story.view.replicas == 5
    story.run()
    story.demand = Demand(unserved=5)  # more crawlers came while the members came up
    turned = story.step()
    assert turned is not None
    assert turned.pressure == "up"
    assert story.wait(UP - 1).decide() is None
    scaled = story.wait(1).step()
    assert scaled is not None
    assert scaled.scaled_to == 7


def test_the_load_that_falls_back_before_scale_up_after_changes_nothing() -> None:
    story = lease(settled(autoscaled()), 2)
    story.demand = Demand(unserved=2)
    story.step()
    story.wait(UP / 2)
    story.demand = Demand()
    back = story.step()
    assert back is not None
    assert back.pressure == "steady"
    assert story.wait(UP * 10).decide() is None
    assert story.view.replicas == 2


def test_the_maximum_holds_and_the_decision_says_so() -> None:
    story = settled(autoscaled(max_=4))
    lease(story, 2)
    story.demand = Demand(unserved=50)
    story.step()
    scaled = story.wait(UP).step()
    assert scaled is not None
    assert scaled.scaled_to == 4
    story.run()
    lease(story, 4)
    assert story.decide() is None  # at max: the load points nowhere it may go


def test_idle_members_go_after_scale_down_after_but_never_a_leased_one() -> None:
    story = PoolStory(autoscaled(min_=1, replicas=6))
    story.step()
    assert story.decide() is None  # members not Ready yet: no load to judge
    story.run()
    for uid in story.active()[:3]:
        story.set(uid, leased=True)
    turned = story.step()
    assert turned is not None
    assert turned.pressure == "down"
    assert turned.wanted == 3
    assert story.wait(DOWN - 1).decide() is None
    scaled = story.wait(1).step()
    assert scaled is not None
    assert scaled.scaled_to == 3
    leased = {uid for uid, s in story.states.items() if s.leased}
    assert set(scaled.retired).isdisjoint(leased)
    assert len(scaled.retired) == 3


def test_no_scale_down_while_anyone_is_unserved() -> None:
    story = PoolStory(autoscaled(min_=1, replicas=6))
    story.step()
    story.run()
    story.demand = Demand(waiting=1, unserved=0)
    assert story.decide() is None  # steady: somebody waits


def test_target_leased_leaves_headroom() -> None:
    story = settled(autoscaled(min_=2, target=0.5))
    lease(story, 2)  # 2 of 2 leased: above the target of half
    turned = story.step()
    assert turned is not None
    assert turned.pressure == "up"
    assert turned.wanted == 4


def test_a_pool_without_autoscale_ignores_demand() -> None:
    story = PoolStory(pool_spec(2))
    story.step()
    story.run()
    story.demand = Demand(waiting=10, unserved=10)
    assert story.wait(3600).decide() is None


def test_a_scale_or_pressure_on_a_pool_without_autoscale_is_unusable() -> None:
    story = PoolStory(pool_spec(2))
    story.add(PoolPressure(uid=UID, pressure="up"))
    story.add(PoolDecided(uid=UID, reason="Autoscale", scaled_to=50))
    assert story.view.replicas == 2
    assert story.view.pressure == "steady"
    assert story.view.unusable == 2


@pytest.mark.parametrize("pressure", ["sideways", "", "UP", "up\n"])
def test_a_pressure_no_controller_writes_is_unusable(pressure: str) -> None:
    story = settled(autoscaled())
    story.add(PoolPressure(uid=UID, pressure=pressure))
    assert story.view.pressure == "steady"
    assert story.view.unusable == 1


@pytest.mark.parametrize("scaled_to", [-1, 10_001, 2**63])
def test_a_scale_out_of_bounds_is_unusable(scaled_to: int) -> None:
    story = settled(autoscaled())
    story.add(PoolDecided(uid=UID, reason="Autoscale", scaled_to=scaled_to))
    assert story.view.replicas == 2
    assert story.view.unusable == 1


@given(
    leased=st.integers(0, 12),
    unserved=st.integers(0, 10_000),
    waiting=st.integers(0, 10_000),
    seconds=st.lists(st.floats(0, 2 * DOWN), max_size=6),
)
@settings(max_examples=150, deadline=None)
def test_whatever_the_load_the_size_stays_within_bounds_and_leased_members_stay(
    leased: int, unserved: int, waiting: int, seconds: list[float]
) -> None:
    story = settled(autoscaled(min_=2, max_=12))
    lease(story, leased)
    story.demand = Demand(waiting=waiting, unserved=unserved)
    for pause in seconds:
        decision = story.wait(pause).step()
        held = {uid for uid, s in story.states.items() if s.leased}
        if decision is not None:
            assert set(decision.retired).isdisjoint(held)
        assert 2 <= story.view.replicas <= 12
        story.run()
