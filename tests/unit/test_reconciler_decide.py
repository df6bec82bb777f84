"""Reconciler decisions as a table over folded states: no servers, no clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import get_args

import pytest

from events.proxyresource import spec_hash
from events.schemas import (
    CreateInstance,
    DeleteInstance,
    ErrorClass,
    Event,
    External,
    HealthChanged,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    ObserveInstance,
    Phase,
    PhaseChanged,
    Placement,
    ProviderFailed,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyEvent,
    ProxyMode,
    ProxyRemoved,
    ProxySpec,
    ProxySpecChanged,
)
from events.store import Recorded
from services.reconciler.pure.decide import decide, kind_wakes, unhealthy_for, wakes
from services.reconciler.pure.decision import Decision, instance_name
from services.reconciler.pure.view import ProxyState, fold

UID = "0b5e8f8e-1111-4222-8333-944455556666"
SPEC = ProxySpec(provider="local", attributes={"country": "de"})


class Story:
    """Appends events as the reconciler and a well-behaved executor would, and decides."""

    def __init__(self) -> None:
        self.events: list[Recorded] = []

    def add(self, *events: Event) -> Story:
        for event in events:
            seq = len(self.events) + 1
            subject = f"proxy.{UID}.{event.category}"
            self.events.append(Recorded(event, seq, subject, datetime.now(UTC)))  # type: ignore[arg-type]
        return self

    @property
    def state(self) -> ProxyState:
        return fold(UID, self.events)

    def decide(self) -> Decision:
        return decide(self.state)

    def apply_decision(self) -> Decision:
        decision = self.decide()
        self.add(*decision.events)
        return decision

    def command(self) -> Event:
        return next(
            e
            for e in (r.event for r in reversed(self.events))
            if isinstance(e, Event) and e.category == "cmd"
        )


def declared(spec: ProxySpec = SPEC) -> ProxyDeclared:
    return ProxyDeclared(uid=UID, namespace="ns", name="p1", spec=spec)


def running(story: Story, ip: str = "10.0.0.1") -> None:
    cmd = story.command()
    assert isinstance(cmd, CreateInstance)
    pid = f"id-{cmd.instance_name}"
    story.add(
        InstanceCreated(command_id=cmd.command_id, provider=cmd.provider, provider_id=pid),
        InstanceObserved(
            command_id=cmd.command_id,
            provider=cmd.provider,
            provider_id=pid,
            state=InstanceState.RUNNING,
            ip=ip,
            url=f"http://{ip}:3128",
        ),
    )


def gone(story: Story) -> None:
    cmd = story.command()
    assert isinstance(cmd, DeleteInstance)
    story.add(
        InstanceGone(command_id=cmd.command_id, provider=cmd.provider, provider_id=cmd.provider_id)
    )


def creating() -> tuple[Story, CreateInstance]:
    """A declared proxy whose create command is out."""
    story = Story().add(declared())
    story.apply_decision()
    cmd = story.command()
    assert isinstance(cmd, CreateInstance)
    return story, cmd


def create_failed(cmd: CreateInstance, error_class: ErrorClass, message: str) -> ProviderFailed:
    return ProviderFailed(
        command_id=cmd.command_id,
        provider="local",
        operation="create",
        error_class=error_class,
        message=message,
    )


def ready_story() -> Story:
    story = Story().add(declared())
    story.apply_decision()
    running(story)
    story.apply_decision()
    return story


def status(decision: Decision) -> PhaseChanged:
    found = [e for e in decision.events if isinstance(e, PhaseChanged)]
    assert len(found) == 1
    return found[0]


def test_nothing_before_a_declaration() -> None:
    assert Story().decide().events == ()


def test_declared_creates_with_a_deterministic_name() -> None:
    story = Story().add(declared())
    decision = story.decide()
    create = decision.events[0]
    assert isinstance(create, CreateInstance)
    assert create.instance_name == instance_name(UID, spec_hash(SPEC))
    assert create.instance_name.startswith(f"px-{UID}-")
    assert len(create.instance_name) <= 63
    assert create.command_id == f"{UID}-c1"
    assert status(decision).phase is Phase.PROVISIONING
    assert story.decide() == decision, "the same state decides the same thing"


def test_waits_while_a_command_is_out() -> None:
    story = Story().add(declared())
    story.apply_decision()
    assert story.decide().events == ()


def test_running_instance_makes_the_proxy_ready_once() -> None:
    story = ready_story()
    ready = [r.event for r in story.events if isinstance(r.event, PhaseChanged)][-1]
    assert ready.phase is Phase.READY
    assert ready.url == "http://10.0.0.1:3128"
    assert ready.conditions[0].type == "Ready"
    assert ready.conditions[0].status == "True"
    assert story.decide().events == (), "facts, not polls: nothing new to say"


def test_spec_change_replaces_delete_then_create_with_new_name() -> None:
    story = ready_story()
    old = story.state.instance_id
    new_spec = ProxySpec(provider="local", placement=Placement(zone="b"))
    story.add(ProxySpecChanged(uid=UID, spec=new_spec, generation=2))
    decision = story.apply_decision()
    assert isinstance(decision.events[0], DeleteInstance)
    assert decision.events[0].provider_id == old
    assert status(decision).phase is Phase.REPLACING
    assert story.decide().events == (), "wait for NotFound before creating"
    gone(story)
    decision = story.apply_decision()
    create = decision.events[0]
    assert isinstance(create, CreateInstance)
    assert create.instance_name == instance_name(UID, spec_hash(new_spec))
    running(story, ip="10.0.0.2")
    ready = status(story.apply_decision())
    assert ready.ip == "10.0.0.2"
    assert ready.observed_generation == 2


def test_attribute_change_replaces_nothing() -> None:
    story = ready_story()
    story.add(ProxySpecChanged(uid=UID, spec=ProxySpec(provider="local"), generation=2))
    decision = story.decide()
    assert not any(isinstance(e, (DeleteInstance, CreateInstance)) for e in decision.events)
    assert status(decision).observed_generation == 2


@pytest.mark.parametrize("state", [InstanceState.STOPPED, InstanceState.TERMINATING])
def test_stopped_instance_is_replaced(state: InstanceState) -> None:
    story = ready_story()
    pid = story.state.instance_id
    story.add(
        InstanceObserved(command_id="observe-1", provider="local", provider_id=pid, state=state)
    )
    decision = story.decide()
    assert isinstance(decision.events[0], DeleteInstance)
    assert status(decision).reason == "InstanceStopped"


def test_vanished_instance_is_recreated() -> None:
    story = ready_story()
    pid = story.state.instance_id
    story.add(InstanceGone(command_id="observe-1", provider="local", provider_id=pid))
    decision = story.decide()
    assert isinstance(decision.events[0], CreateInstance)
    assert status(decision).reason == "Recreating"


def test_permanent_error_latches_failed_until_the_spec_changes() -> None:
    story, cmd = creating()
    story.add(create_failed(cmd, ErrorClass.PERMANENT, "image not found"))
    failed = status(story.apply_decision())
    assert failed.phase is Phase.FAILED
    assert "image not found" in failed.message
    assert story.decide().events == (), "latched: no retry, no new status"
    story.add(ProxySpecChanged(uid=UID, spec=ProxySpec(provider="local2"), generation=2))
    assert isinstance(story.decide().events[0], CreateInstance)


def test_quota_keeps_waiting_with_a_reason() -> None:
    story, cmd = creating()
    story.add(create_failed(cmd, ErrorClass.QUOTA_EXCEEDED, "CPUS quota"))
    decision = story.apply_decision()
    assert [type(e) for e in decision.events] == [PhaseChanged]
    assert status(decision).reason == "QuotaExceeded"
    assert story.decide().events == ()


def test_create_timeout_replaces_the_instance() -> None:
    story, cmd = creating()
    story.add(
        InstanceCreated(command_id=cmd.command_id, provider="local", provider_id="i-1"),
        create_failed(cmd, ErrorClass.TRANSIENT, "not running after 600s"),
    )
    decision = story.decide()
    assert isinstance(decision.events[0], DeleteInstance)
    assert status(decision).reason == "CreateTimedOut"


def test_deletion_deletes_waits_then_removes() -> None:
    story = ready_story()
    story.add(ProxyDeletionRequested(uid=UID))
    decision = story.apply_decision()
    assert isinstance(decision.events[0], DeleteInstance)
    assert status(decision).phase is Phase.DELETING
    assert story.decide().events == ()
    gone(story)
    assert story.apply_decision().events == (ProxyRemoved(uid=UID),)
    assert story.decide().events == ()


def test_deletion_during_create_waits_for_the_answer() -> None:
    story = Story().add(declared())
    story.apply_decision()
    story.add(ProxyDeletionRequested(uid=UID))
    assert story.decide().events == ()
    running(story)
    assert isinstance(story.decide().events[0], DeleteInstance)


def test_deletion_without_instance_removes_at_once() -> None:
    story = Story().add(declared(), ProxyDeletionRequested(uid=UID))
    assert story.decide().events == (ProxyRemoved(uid=UID),)


def test_redeclared_after_removal_is_a_new_life() -> None:
    story = ready_story()
    story.add(ProxyDeletionRequested(uid=UID))
    story.apply_decision()
    gone(story)
    story.apply_decision()
    story.add(declared())
    create = story.decide().events[0]
    assert isinstance(create, CreateInstance)
    first = story.events[1].event
    assert isinstance(first, CreateInstance)
    assert create.command_id != first.command_id


def test_external_mode_publishes_the_url_without_provider_io() -> None:
    spec = ProxySpec(mode=ProxyMode.EXTERNAL, external=External(url="http://10.9.9.9:8080"))
    story = Story().add(declared(spec))
    decision = story.decide()
    assert [type(e) for e in decision.events] == [PhaseChanged]
    assert status(decision).phase is Phase.READY
    assert status(decision).url == "http://10.9.9.9:8080"


def test_invalid_spec_fails_with_the_field_named() -> None:
    story = Story().add(declared(ProxySpec(provider="")))
    failed = status(story.decide())
    assert failed.phase is Phase.FAILED
    assert failed.reason == "InvalidSpec"
    assert "spec.provider" in failed.message


def test_unknown_instance_state_is_observed_again() -> None:
    story, cmd = creating()
    story.add(
        InstanceCreated(command_id=cmd.command_id, provider="local", provider_id="i-1"),
        InstanceObserved(
            command_id=cmd.command_id,
            provider="local",
            provider_id="i-1",
            state=InstanceState.PENDING,
        ),
    )
    decision = story.decide()
    assert isinstance(decision.events[0], ObserveInstance)


def unhealthy(story: Story, reason: str = "ProbeTimeout") -> None:
    pid = story.state.instance_id
    story.add(HealthChanged(healthy=False, reason=reason, message="5s", provider_id=pid))


def test_unhealthy_stays_ready_with_a_failing_health_condition() -> None:
    story = ready_story()
    unhealthy(story)
    changed = status(story.apply_decision())
    assert changed.phase is Phase.READY
    assert changed.reason == "ProbeTimeout"
    healthy = next(c for c in changed.conditions if c.type == "Healthy")
    assert (healthy.status, healthy.reason) == ("False", "ProbeTimeout")
    assert story.decide().events == ()
    story.add(HealthChanged(healthy=True, provider_id=story.state.instance_id))
    back = status(story.apply_decision())
    assert back.reason == "InstanceRunning"
    assert next(c for c in back.conditions if c.type == "Healthy").status == "True"


def test_unhealthy_too_long_is_replaced_only_when_enabled_and_due() -> None:
    story = ready_story()
    unhealthy(story)
    since = story.events[-1].timestamp
    assert story.state.unhealthy_since == since
    later = since + timedelta(seconds=30)
    assert not any(isinstance(e, DeleteInstance) for e in decide(story.state, later, 0).events)
    early = decide(story.state, since + timedelta(seconds=10), 30).events
    assert not any(isinstance(e, DeleteInstance) for e in early)
    due = decide(story.state, later, 30)
    assert isinstance(due.events[0], DeleteInstance)
    assert status(due).reason == "Unhealthy"
    assert unhealthy_for(story.state, later) == 30


def test_a_verdict_on_a_replaced_instance_is_ignored_and_a_new_instance_starts_fresh() -> None:
    story = ready_story()
    story.add(HealthChanged(healthy=False, reason="old", provider_id="someone-else"))
    assert story.state.healthy is None
    unhealthy(story)
    story.add(ProxySpecChanged(uid=UID, spec=ProxySpec(provider="local2"), generation=2))
    story.apply_decision()
    gone(story)
    story.apply_decision()
    assert story.state.healthy is None
    assert story.state.unhealthy_since is None


def test_instance_created_wakes_nothing_because_it_never_changes_a_decision() -> None:
    story, cmd = creating()
    created = InstanceCreated(command_id=cmd.command_id, provider="local", provider_id="i-1")
    before = story.decide()
    story.add(created)
    assert not wakes(created)
    assert story.decide() == before
    assert story.decide().events == ()
    assert wakes(InstanceGone(command_id="c", provider="local", provider_id="i-1"))


@pytest.mark.parametrize("kind", get_args(ProxyEvent), ids=lambda k: k.__name__)
def test_only_the_waking_categories_wake_a_reconcile(kind: type) -> None:
    """The reconciler's durable delivers every category (one filter costs the server the same
    at any fleet size); its own decisions (cmd, status) and egress facts wake nothing."""
    woken = getattr(kind, "category", "") in {"declared", "instance", "health", "rotate"}
    assert kind_wakes(kind) is (woken and kind is not InstanceCreated)
