"""When the reconciler comes back to a proxy no event will wake (``decide.revisit``), as a table
over the rotation stories of ``test_decide_rotate``: no servers, no clock but the story's."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.reconciler.pure.decide import SLACK, Later, decide, revisit
from tests.support.rotation_stories import DRAIN, Story, promoted, ready, requested

AFTER = 30.0
"""``--replace-unhealthy-after`` of the stories that replace an unhealthy instance."""


def healthy() -> Story:
    story, _ = ready()
    return story


def promoting() -> Story:
    story, _, create = requested()
    story.healthy(story.run(create, ip="10.0.0.2"))
    return story


def draining(seconds: float) -> Callable[[], Story]:
    def build() -> Story:
        story, _, _ = promoted()
        return story.wait(seconds)

    return build


def retiring_with_its_delete_out() -> Story:
    story, _, _ = promoted()
    story.wait(DRAIN)
    assert story.step().outcome == "retire"
    return story


def unhealthy_for(seconds: float) -> Callable[[], Story]:
    def build() -> Story:
        story, pid = ready()
        story.healthy(pid, healthy=False)
        return story.wait(seconds)

    return build


CASES = [
    pytest.param(healthy, AFTER, "noop", None, id="Ready and healthy: only an event wakes it"),
    pytest.param(
        promoting, AFTER, "promote", Later(DRAIN + SLACK, "draining"), id="a promotion: the drain"
    ),
    pytest.param(
        draining(4), AFTER, "noop", Later(DRAIN - 4 + SLACK, "draining"), id="draining: the rest"
    ),
    pytest.param(draining(DRAIN), AFTER, "retire", None, id="drained: the delete is decided"),
    pytest.param(
        retiring_with_its_delete_out, AFTER, "noop", None, id="the delete out: its answer wakes"
    ),
    pytest.param(
        unhealthy_for(10),
        AFTER,
        "unhealthy",
        Later(AFTER - 10 + SLACK, "unhealthy"),
        id="unhealthy 10 s of 30: at 30",
    ),
    pytest.param(unhealthy_for(AFTER), AFTER, "replace", None, id="unhealthy 30 s: replaced"),
    pytest.param(unhealthy_for(10), 0.0, "unhealthy", None, id="unhealthy, never replaced for it"),
]


@pytest.mark.parametrize(("build", "after", "outcome", "expected"), CASES)
def test_when_the_reconciler_comes_back(
    build: Callable[[], Story], after: float, outcome: str, expected: Later | None
) -> None:
    story = build()
    state = story.state
    decision = decide(state, story.now, after, leased=story.leased, drain=DRAIN)
    assert decision.outcome == outcome
    later = revisit(state, decision, story.now, after, drain=DRAIN)
    if expected is None:
        assert later is None
    else:
        assert later is not None
        assert later.reason == expected.reason
        assert later.delay == pytest.approx(expected.delay)


def test_coming_back_is_a_function_of_the_state_and_the_clock() -> None:
    story = draining(4)()
    state = story.state
    decision = decide(state, story.now, AFTER, drain=DRAIN)
    assert revisit(state, decision, story.now, AFTER, drain=DRAIN) == revisit(
        state, decision, story.now, AFTER, drain=DRAIN
    )
    later = revisit(state, decision, story.wait(1).now, AFTER, drain=DRAIN)
    assert later is not None
    assert later.delay == pytest.approx(DRAIN - 5 + SLACK)
