"""The command/answer protocol the executor and the reconciler share: which answers conclude a
command, and how the pending command moves with each answer. Pure, no servers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from events.schemas import (
    AnyEvent,
    CreateInstance,
    DeleteInstance,
    ErrorClass,
    Event,
    HealthChanged,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    ObserveInstance,
    Phase,
    PhaseChanged,
    ProviderFailed,
    ProxySpec,
)
from events.store import Recorded
from projections.commands import (
    Answer,
    Pending,
    answered,
    answers,
    answers_to,
    concludes,
    issued,
)
from services.reconciler.pure.view import ProxyState, fold

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def rec(seq: int, event: AnyEvent, category: str = "instance") -> Recorded:
    return Recorded(event=event, seq=seq, subject=f"proxy.u1.{category}", timestamp=T0)


def failed(error_class: ErrorClass, command_id: str = "c1", message: str = "m") -> ProviderFailed:
    return ProviderFailed(
        command_id=command_id,
        provider="p",
        operation="create",
        error_class=error_class,
        message=message,
    )


def running(command_id: str = "c1") -> InstanceObserved:
    return InstanceObserved(
        command_id=command_id, provider="p", provider_id="x", state=InstanceState.RUNNING
    )


CREATE = CreateInstance(command_id="c1", provider="p", instance_name="n", spec=ProxySpec())


@pytest.mark.parametrize(
    ("answer", "final"),
    [
        (InstanceCreated(command_id="c1", provider="p", provider_id="x"), False),
        (running(), True),
        (
            InstanceObserved(
                command_id="c1", provider="p", provider_id="x", state=InstanceState.STOPPED
            ),
            True,
        ),
        (InstanceGone(command_id="c1", provider="p", provider_id="x"), True),
        (failed(ErrorClass.PERMANENT), True),
        (failed(ErrorClass.TRANSIENT), True),
        (failed(ErrorClass.NOT_FOUND), True),
        (failed(ErrorClass.QUOTA_EXCEEDED), False),
        (HealthChanged(healthy=True), False),
        (CREATE, False),
    ],
)
def test_which_answers_conclude_a_command(answer: Event, final: bool) -> None:
    assert concludes(answer) is final


def test_answers_belong_to_their_command() -> None:
    mine = InstanceCreated(command_id="c1", provider="p", provider_id="x")
    events = [
        rec(1, failed(ErrorClass.PERMANENT, command_id="c0")),
        rec(2, PhaseChanged(phase=Phase.PROVISIONING), "status"),
        rec(3, CREATE, "cmd"),
        rec(4, mine),
    ]
    assert answers_to(events, "c1") == [mine]
    assert answers_to(events, "c9") == []


def test_an_issued_command_is_pending_with_its_kind() -> None:
    assert issued(CREATE) == Pending(command_id="c1", kind="create", provider="p")
    delete = DeleteInstance(command_id="c2", provider="p", provider_id="i-1")
    assert issued(delete) == Pending(
        command_id="c2", kind="delete", provider="p", provider_id="i-1"
    )
    observe = ObserveInstance(command_id="c3", provider="p", provider_id="i-1")
    assert issued(observe).kind == "observe"


@pytest.mark.parametrize(
    ("answer", "after"),
    [
        (InstanceCreated(command_id="c1", provider="p", provider_id="x"), "pending"),
        (running(), "concluded"),
        (InstanceGone(command_id="c1", provider="p", provider_id="x"), "concluded"),
        (failed(ErrorClass.PERMANENT), "concluded"),
        (failed(ErrorClass.TRANSIENT), "concluded"),
        (failed(ErrorClass.QUOTA_EXCEEDED, message="quota 'CPUS' exceeded"), "waiting"),
        (running("c0"), "pending"),  # about an earlier command: changes nothing
        (failed(ErrorClass.PERMANENT, command_id="c0"), "pending"),
    ],
)
def test_the_pending_command_after_an_answer(answer: Answer, after: str) -> None:
    pending = issued(CREATE)
    result = answered(pending, answer)
    assert answers(pending, answer) is (answer.command_id == "c1")
    match after:
        case "concluded":
            assert result is None
        case "pending":
            assert result == pending
        case _:
            assert result == Pending(
                command_id="c1", kind="create", provider="p", quota_message="quota 'CPUS' exceeded"
            )


def test_no_pending_command_stays_none() -> None:
    assert answered(None, running()) is None
    assert not answers(None, running())


def test_the_executor_and_the_reconciler_agree() -> None:
    """The reconciler's fold keeps a command pending exactly as long as the executor keeps
    working on it."""
    for answer in (
        InstanceCreated(command_id="c1", provider="p", provider_id="x"),
        running(),
        failed(ErrorClass.PERMANENT),
        failed(ErrorClass.QUOTA_EXCEEDED),
        failed(ErrorClass.TRANSIENT),
    ):
        declared = ProxyState(uid="u1", declared=True)  # a proxy exists from its declaration
        state = fold("u1", [rec(1, CREATE, "cmd"), rec(2, answer)], declared)
        assert (state.pending is None) is concludes(answer), answer
