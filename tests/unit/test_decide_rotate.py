"""Make-before-break rotations as stories over the reconciler's pure decide (D85): no servers,
no clock but the one each story passes in."""

from __future__ import annotations

from events.schemas import (
    CreateInstance,
    DeleteInstance,
    ErrorClass,
    InstanceGone,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyRemoved,
    ProxySpecChanged,
    ReplacementPromoted,
    ReplacementStarted,
    RotationEnded,
    RotationRequested,
)
from services.reconciler.pure.decide_rotate import needs_lease, retire_in
from services.reconciler.pure.decision import Decision
from tests.support.rotation_stories import (
    DRAIN,
    NEW_SPEC,
    SPEC,
    UID,
    Story,
    failed,
    of,
    promoted,
    ready,
    requested,
)


def test_a_requested_rotation_creates_a_replacement_beside_the_serving_instance() -> None:
    story, old, create = requested()
    state = story.state
    first = story.events[1].event
    assert isinstance(first, CreateInstance)
    assert create.instance_name != first.instance_name
    assert create.spec == SPEC
    assert state.instance_id == old
    assert state.ip == "10.0.0.1"
    assert state.replacement is not None
    assert state.replacement.rotation_id == "rot-1"
    assert state.status is not None
    assert state.status.phase is Phase.READY


def test_the_replacement_takes_over_only_once_running_and_healthy() -> None:
    story, old, create = requested()
    new = story.run(create, ip="10.0.0.2")
    assert story.decide().events == ()  # running, not judged yet: the health service probes it
    story.healthy(old)  # a verdict on the serving instance is no verdict on the replacement
    assert story.decide().events == ()
    story.healthy(new)
    decision = story.step()
    assert decision.outcome == "promote"
    assert [type(e) for e in decision.events] == [ReplacementPromoted, PhaseChanged]
    promoted_event, status = decision.events
    assert isinstance(promoted_event, ReplacementPromoted)
    assert (promoted_event.provider_id, promoted_event.retired_provider_id) == (new, old)
    assert isinstance(status, PhaseChanged)
    assert (status.phase, status.ip, status.provider_id) == (Phase.READY, "10.0.0.2", new)
    assert not of(decision, DeleteInstance)  # the old one serves until the drain is over


def test_the_old_instance_is_deleted_after_the_drain_and_then_all_is_quiet() -> None:
    story, old, new = promoted()
    assert story.state.instance_id == new
    assert story.state.retiring_id == old
    story.wait(DRAIN / 2)
    assert story.decide().events == ()
    assert retire_in(story.state, story.now, DRAIN) == DRAIN / 2
    story.wait(DRAIN / 2)
    decision = story.step()
    assert decision.outcome == "retire"
    (delete,) = decision.events
    assert isinstance(delete, DeleteInstance)
    assert delete.provider_id == old
    story.gone()
    state = story.state
    assert (state.instance_id, state.ip, state.retiring_id, state.healthy) == (
        new,
        "10.0.0.2",
        "",
        True,
    )
    assert story.decide().events == ()


def test_a_start_appended_in_half_issues_its_create_and_goes_on() -> None:
    """The store appends a decision's events one by one; another writer's append between them
    refuses the second. A ReplacementStarted without its CreateInstance is not a changed spec:
    the create is issued again, with the started command's id, and the rotation carries on."""
    story, old = ready()
    story.add(RotationRequested(uid=UID, rotation_id="rot-1", lease_id="lease-1"))
    started, whole = story.decide().events
    assert isinstance(started, ReplacementStarted)
    assert isinstance(whole, CreateInstance)
    story.add(started)  # the CreateInstance was refused
    story.healthy(old)  # another writer's event in between
    decision = story.step()
    assert decision.outcome == "rotate"
    assert decision.events == (whole,)
    new = story.run(whole, ip="10.0.0.2")
    story.healthy(new)
    assert story.step().outcome == "promote"


def test_deciding_twice_on_one_state_gives_the_same_events() -> None:
    story, _, _ = requested()
    assert story.decide() == story.decide()


def test_a_second_request_during_a_rotation_changes_nothing() -> None:
    story, _, _create = requested()
    story.add(RotationRequested(uid=UID, rotation_id="rot-2", lease_id="lease-1"))
    assert story.state.replacement is not None
    assert story.state.replacement.rotation_id == "rot-1"
    assert story.state.rotation_requested == ""
    assert story.decide().events == ()  # the create is still out


def test_a_replacement_that_fails_its_probes_is_given_up_and_deleted() -> None:
    story, old, create = requested()
    new = story.run(create, ip="10.0.0.2")
    story.healthy(new, healthy=False)
    decision = story.step()
    assert decision.outcome == "rotation_failed"
    delete, ended = decision.events
    assert isinstance(delete, DeleteInstance)
    assert delete.provider_id == new
    assert isinstance(ended, RotationEnded)
    assert ended.outcome == "failed"
    story.gone()
    state = story.state
    assert (state.instance_id, state.ip, state.replacement) == (old, "10.0.0.1", None)
    assert story.decide().events == ()  # still Ready on the old instance


def test_a_replacement_whose_create_fails_ends_the_rotation_without_failing_the_proxy() -> None:
    story, old, create = requested()
    story.add(failed(create))
    decision = story.step()
    (ended,) = decision.events
    assert isinstance(ended, RotationEnded)
    assert "no such image" in ended.message
    assert story.state.failed_hash == ""
    assert story.state.instance_id == old
    assert story.decide().events == ()


def test_a_quota_wait_for_the_replacement_keeps_the_proxy_ready() -> None:
    story, _, create = requested()
    story.add(failed(create, ErrorClass.QUOTA_EXCEEDED, "quota"))
    assert story.decide().events == ()


def test_a_replacement_that_vanishes_is_given_up_without_a_delete() -> None:
    story, old, create = requested()
    new = story.run(create, ip="10.0.0.2")
    story.add(InstanceGone(command_id="observe-9", provider="local", provider_id=new))
    decision = story.step()
    assert [type(e) for e in decision.events] == [RotationEnded]
    assert story.state.instance_id == old


def test_a_leased_proxys_spec_change_is_made_before_it_is_broken() -> None:
    story, old = ready()
    story.add(ProxySpecChanged(uid=UID, spec=NEW_SPEC, generation=2))
    assert needs_lease(story.state)
    story.leased = True
    decision = story.step()
    assert decision.outcome == "rotate"
    started = of(decision, ReplacementStarted)[0]
    assert isinstance(started, ReplacementStarted)
    assert started.reason == "SpecChanged"
    assert not of(decision, DeleteInstance)
    assert not needs_lease(story.state)  # decided: the rotation runs whatever the lease does
    new = story.run(ip="10.0.0.3")
    story.healthy(new)
    assert story.step().outcome == "promote"
    story.wait(DRAIN)
    (delete,) = story.step().events
    assert isinstance(delete, DeleteInstance)
    assert delete.provider_id == old


def test_an_unleased_proxys_spec_change_is_still_replaced_delete_first() -> None:
    story, old = ready()
    story.add(ProxySpecChanged(uid=UID, spec=NEW_SPEC, generation=2))
    decision = story.step()
    assert decision.outcome == "replace"
    delete = of(decision, DeleteInstance)[0]
    assert isinstance(delete, DeleteInstance)
    assert delete.provider_id == old
    assert status_of(decision).phase is Phase.REPLACING


def status_of(decision: Decision) -> PhaseChanged:
    (status,) = of(decision, PhaseChanged)
    assert isinstance(status, PhaseChanged)
    return status


def test_a_spec_change_during_a_rotation_cancels_it_then_starts_over() -> None:
    story, old, create = requested()
    new = story.run(create, ip="10.0.0.2")
    story.add(ProxySpecChanged(uid=UID, spec=NEW_SPEC, generation=2))
    decision = story.step()
    assert decision.outcome == "rotation_cancelled"
    assert of(decision, DeleteInstance)[0].provider_id == new  # type: ignore[attr-defined]
    story.gone()
    story.leased = True
    assert story.step().outcome == "rotate"
    assert story.state.instance_id == old


def test_deleting_during_a_rotation_deletes_the_replacement_then_the_instance() -> None:
    story, old, create = requested()
    new = story.run(create, ip="10.0.0.2")
    story.add(ProxyDeletionRequested(uid=UID))
    first = story.step()
    assert of(first, DeleteInstance)[0].provider_id == new  # type: ignore[attr-defined]
    story.gone()
    second = story.step()
    assert of(second, DeleteInstance)[0].provider_id == old  # type: ignore[attr-defined]
    story.gone()
    assert story.step().events == (ProxyRemoved(uid=UID),)


def test_deleting_during_the_drain_deletes_the_old_instance_then_the_new() -> None:
    story, old, new = promoted()
    story.add(ProxyDeletionRequested(uid=UID))
    first = story.step()
    assert of(first, DeleteInstance)[0].provider_id == old  # type: ignore[attr-defined]
    story.gone()
    second = story.step()
    assert of(second, DeleteInstance)[0].provider_id == new  # type: ignore[attr-defined]
    story.gone()
    assert story.step().events == (ProxyRemoved(uid=UID),)


def test_a_request_waits_for_a_serving_instance() -> None:
    story = Story().add(ProxyDeclared(uid=UID, namespace="ns", name="p1", spec=SPEC))
    story.step()
    story.add(RotationRequested(uid=UID, rotation_id="rot-1"))
    assert story.decide().events == ()  # the create is out
    story.run(ip="10.0.0.1")
    # Asked for after that create went out: honoured once the proxy serves.
    assert story.step().outcome == "rotate"


def test_a_request_before_a_delete_first_replacement_is_satisfied_by_it() -> None:
    story, old = ready()
    story.add(RotationRequested(uid=UID, rotation_id="rot-1"))
    story.add(ProxySpecChanged(uid=UID, spec=NEW_SPEC, generation=2))
    story.add(InstanceGone(command_id="observe-1", provider="local", provider_id=old))
    assert story.step().outcome == "create"  # the instance is gone: nothing to keep serving
    assert story.state.rotation_requested == ""  # the new instance is the fresh one


def test_a_retired_instance_whose_delete_can_never_work_latches_failed_once() -> None:
    story, old, _ = promoted()
    story.wait(DRAIN)
    (delete,) = story.step().events
    assert isinstance(delete, DeleteInstance)
    assert delete.provider_id == old
    story.add(failed(delete, message="forbidden"))
    decision = story.step()
    assert status_of(decision).phase is Phase.FAILED
    assert not of(decision, DeleteInstance)  # no retry loop
    assert story.decide().events == ()
