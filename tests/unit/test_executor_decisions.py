"""The executor's pure decisions: delays, which answers end a command, what the sweep records."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from events.schemas import (
    AnyEvent,
    ErrorClass,
    Event,
    HealthChanged,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    Phase,
    PhaseChanged,
    ProviderFailed,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxySpec,
)
from events.store import History, Recorded
from services.executor.commands import CommandPolicy, command_answers, is_final, observed
from services.executor.observe import GONE, Facts, apply_facts, observation, watched
from services.providers.base import Instance

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def rec(seq: int, event: AnyEvent, category: str = "instance") -> Recorded:
    return Recorded(event=event, seq=seq, subject=f"proxy.u1.{category}", timestamp=T0)


def failed(error_class: ErrorClass, command_id: str = "c1") -> ProviderFailed:
    return ProviderFailed(
        command_id=command_id,
        provider="p",
        operation="create",
        error_class=error_class,
        message="m",
    )


def instance(state: InstanceState = InstanceState.RUNNING, ip: str = "10.0.0.1") -> Instance:
    return Instance(
        provider_id="pid-1", name="n", state=state, owner_uid="u1", created_at=T0, ip=ip
    )


def test_poll_delay_grows_to_its_cap() -> None:
    policy = CommandPolicy(poll_initial=0.5, poll_max=5.0, poll_growth=2.0)
    assert [policy.poll_delay(a) for a in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 4.0, 5.0]
    assert policy.poll_delay(10_000) == 5.0


def test_backoff_doubles_to_its_cap() -> None:
    policy = CommandPolicy(backoff_base=1.0, backoff_max=60.0)
    assert [policy.backoff(a) for a in (1, 2, 3, 7, 8)] == [1.0, 2.0, 4.0, 60.0, 60.0]
    assert policy.backoff(10_000) == 60.0


@pytest.mark.parametrize(
    ("answer", "final"),
    [
        (InstanceCreated(command_id="c1", provider="p", provider_id="x"), False),
        (observed("c1", "p", instance()), True),
        (observed("c1", "p", instance(InstanceState.STOPPED, "")), True),
        (InstanceGone(command_id="c1", provider="p", provider_id="x"), True),
        (failed(ErrorClass.PERMANENT), True),
        (failed(ErrorClass.TRANSIENT), True),
        (failed(ErrorClass.QUOTA_EXCEEDED), False),
        (HealthChanged(healthy=True), False),
    ],
)
def test_which_answers_end_a_command(answer: Event, final: bool) -> None:
    assert is_final(answer) is final


def test_command_answers_belong_to_their_command() -> None:
    mine = InstanceCreated(command_id="c1", provider="p", provider_id="x")
    history = History(
        events=[
            rec(1, failed(ErrorClass.PERMANENT, command_id="c0")),
            rec(2, PhaseChanged(phase=Phase.PROVISIONING), "status"),
            rec(3, mine),
        ],
        last_seq=3,
    )
    assert command_answers(history, "c1") == [mine]
    assert command_answers(history, "c9") == []


def test_observed_carries_the_instance() -> None:
    event = observed("c1", "p", instance())
    assert (event.ip, event.url, event.state) == ("10.0.0.1", "http://10.0.0.1:3128", "Running")
    assert event.created_at == T0.isoformat()


def ready_facts(*extra: AnyEvent) -> Facts:
    events: list[Recorded] = [
        rec(1, ProxyDeclared(uid="u1", namespace="n", name="a", spec=ProxySpec(provider="p"))),
        rec(2, InstanceCreated(command_id="c1", provider="p", provider_id="pid-1")),
        rec(3, observed("c1", "p", instance())),
        rec(4, PhaseChanged(phase=Phase.READY, provider_id="pid-1"), "status"),
    ]
    events += [rec(5 + i, e) for i, e in enumerate(extra)]
    facts: Facts | None = None
    for recorded in events:
        facts = apply_facts(facts, recorded)
    assert facts is not None
    return facts


def test_facts_follow_the_current_instance() -> None:
    facts = ready_facts()
    assert (facts.known_state(), facts.ip, facts.view.last_seq) == ("Running", "10.0.0.1", 4)
    assert watched(facts)
    gone = ready_facts(InstanceGone(command_id="o", provider="p", provider_id="pid-1"))
    assert gone.known_state() == GONE
    replaced = ready_facts(InstanceCreated(command_id="c2", provider="p", provider_id="pid-2"))
    assert replaced.known_state() == ""
    assert replaced.view.provider_id == "pid-2"


def test_only_ready_instances_are_watched() -> None:
    deleting = ready_facts()
    deleting = apply_facts(deleting, rec(9, ProxyDeletionRequested(uid="u1"), "declared"))
    assert not watched(deleting)
    replacing = apply_facts(ready_facts(), rec(9, PhaseChanged(phase=Phase.REPLACING), "status"))
    assert not watched(replacing)


def test_unchanged_answers_record_nothing() -> None:
    facts = ready_facts()
    assert observation(facts, instance()) is None
    stopped = ready_facts(observed("o", "p", instance(InstanceState.STOPPED, "")))
    assert observation(stopped, instance(InstanceState.STOPPED, "")) is None
    gone = ready_facts(InstanceGone(command_id="o", provider="p", provider_id="pid-1"))
    assert observation(gone, None) is None


def test_changes_are_recorded_with_an_observe_command_id() -> None:
    facts = ready_facts()
    gone = observation(facts, None)
    assert gone == InstanceGone(command_id="observe-4", provider="p", provider_id="pid-1")
    stopped = observation(facts, instance(InstanceState.STOPPED, ""))
    assert isinstance(stopped, InstanceObserved)
    assert stopped.state is InstanceState.STOPPED
    moved = observation(facts, instance(ip="10.0.0.2"))
    assert isinstance(moved, InstanceObserved)
    assert moved.ip == "10.0.0.2"
    back = ready_facts(observed("o", "p", instance(InstanceState.STOPPED, "")))
    assert isinstance(observation(back, instance()), InstanceObserved)
