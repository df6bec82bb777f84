"""One fold of a rotation (``projections.rotation``): the proxy view, which the API answers
from, and the reconciler's view, which it decides on, hold the same rotation and replacement
after every event of the rotation stories of ``test_decide_rotate``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from events.schemas import (
    ProviderFailed,
    ReplacementPromoted,
    ReplacementStarted,
    RotationRequested,
)
from projections import proxy
from projections.rotation import COMPLETED, CREATING, PROBING, REQUESTED
from services.reconciler.pure.view import fold
from tests.support.rotation_stories import (
    DRAIN,
    UID,
    Story,
    failed,
    promoted,
    ready,
    requested,
)


def retired() -> Story:
    story, _, _ = promoted()
    story.wait(DRAIN)
    story.step()
    story.gone()
    return story


def failed_probes() -> Story:
    story, _, create = requested()
    story.healthy(story.run(create, ip="10.0.0.2"), healthy=False)
    story.step()
    story.gone()
    return story


def create_failed() -> Story:
    story, _, create = requested()
    story.add(failed(create))
    story.step()
    return story


@pytest.mark.parametrize("build", [retired, failed_probes, create_failed])
def test_both_views_hold_one_rotation_after_every_event(build: Callable[[], Story]) -> None:
    story = build()
    for n in range(1, len(story.events) + 1):
        events = story.events[:n]
        view, state = proxy.fold(events), fold(UID, events)
        assert view is not None
        assert state.rotation == view.rotation, events[-1]
        if isinstance(events[-1].event, ProviderFailed) and state.replacement is not None:
            # The view leaves a failed create to the reconciler, who knows whether it is final.
            assert view.replacement is not None
            assert (state.replacement.failure, view.replacement.failure) == (
                "create: no such image",
                "",
            )
        else:
            assert state.replacement == view.replacement, events[-1]
    assert story.state.rotation is not None
    assert story.state.rotation.state in ("completed", "failed")


def test_the_rotation_moves_through_its_states_in_both_views() -> None:
    story, _, create = requested()
    seen = [(story.state.rotation, proxy.fold(story.events))]
    new = story.run(create, ip="10.0.0.2")
    seen.append((story.state.rotation, proxy.fold(story.events)))
    story.healthy(new)
    story.step()
    seen.append((story.state.rotation, proxy.fold(story.events)))
    states = []
    for rotation, view in seen:
        assert view is not None
        assert rotation == view.rotation
        assert rotation is not None
        states.append(rotation.state)
    assert states == [CREATING, PROBING, COMPLETED]
    assert story.state.rotation_requested == ""


def test_a_request_waits_in_the_rotation_until_a_replacement_starts() -> None:
    story, _ = ready()
    story.add(RotationRequested(uid=UID, rotation_id="rot-1", lease_id="lease-1"))
    rotation = story.state.rotation
    assert rotation is not None
    assert (rotation.state, story.state.rotation_requested, story.state.rotation_lease) == (
        REQUESTED,
        "rot-1",
        "lease-1",
    )


def test_a_promotion_of_a_replacement_never_created_hands_the_reconciler_nothing() -> None:
    """Only a log the reconciler did not write holds one (a test playing the reconciler): the
    view takes the event's word for the new instance, the reconciler has no instance to take."""
    story, old = ready()
    story.add(ReplacementStarted(rotation_id="rot-1", command_id="c-rot-1"))
    story.add(ReplacementPromoted(rotation_id="rot-1", provider_id="new", ip="10.0.0.9"))
    view = proxy.fold(story.events)
    assert view is not None
    assert (view.provider_id, view.replacement) == ("new", None)
    state = story.state
    assert (state.instance_id, state.replacement is not None) == (old, True)
