"""The executor's decisions as tables (``services.executor.pure.answers``): what a provider's
error comes to (the failure mapping), and what a created instance's state comes to while the
create waits. The clock is passed in; the handler around them is tested in test_executor_*
and tests/integration/test_executor.py."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from events.schemas import (
    CreateInstance,
    DeleteInstance,
    ErrorClass,
    InstanceCreated,
    InstanceObserved,
    InstanceState,
    ProviderFailed,
    ProxySpec,
)
from events.store import Recorded
from projections.commands import Answer
from services.executor.pure.answers import (
    Step,
    created_record,
    creating,
    failed,
    failure,
    observed,
)
from services.executor.pure.policy import CommandPolicy
from services.providers.base import (
    Instance,
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
POLICY = CommandPolicy(quota_delay=60.0, create_timeout=600.0, retry_for=600.0)
CREATE = CreateInstance(command_id="c1", provider="p", instance_name="i", spec=ProxySpec())
DELETE = DeleteInstance(command_id="d1", provider="p", provider_id="pid-1")
QUOTA_SEEN = failure(DELETE, "delete", ErrorClass.QUOTA_EXCEEDED, "limit", "pid-1")


def instance(state: InstanceState, ip: str = "") -> Instance:
    return Instance(
        provider_id="pid-1", name="n", state=state, owner_uid="u1", created_at=T0, ip=ip
    )


@dataclass(frozen=True)
class Failure:
    """One row: an error after ``waited`` seconds, at ``attempt``, with ``answers`` so far."""

    name: str
    error: ProviderError
    outcome: str
    retry: float | None
    what: str = ""
    recorded: ErrorClass | None = None
    answers: tuple[Answer, ...] = ()
    waited: float = 0.0
    attempt: int = 1


QUOTA, GAVE_UP = ErrorClass.QUOTA_EXCEEDED, ErrorClass.TRANSIENT
LATER = (InstanceCreated(command_id="d1", provider="p", provider_id="pid-1"),)
FAILURES = [
    Failure("quota-first", QuotaExceeded("x"), "quota", 60.0, "quota-0", QUOTA),
    Failure("quota-after-an-answer", QuotaExceeded("x"), "quota", 60.0, "quota-1", QUOTA, LATER),
    Failure("quota-again", QuotaExceeded("x"), "quota", 60.0, answers=(QUOTA_SEEN,)),
    Failure("quota-says", QuotaExceeded("x", retry_after=300.0), "quota", 300.0, "quota-0", QUOTA),
    Failure("quota-waits-on", QuotaExceeded("x"), "quota", 60.0, answers=(QUOTA_SEEN,), waited=1e4),
    Failure("permanent", Permanent("x"), "permanent", None, "failed-delete", ErrorClass.PERMANENT),
    Failure("transient-first", Transient("503"), "transient", 1.0),
    Failure("transient-backs-off", Transient("503"), "transient", 8.0, attempt=4),
    Failure("transient-says", Transient("429", retry_after=42.0), "transient", 42.0),
    Failure("transient-almost-too-long", Transient("503"), "transient", 1.0, waited=599.0),
    Failure("too-long", Transient("503"), "gave-up", None, "gave-up-delete", GAVE_UP, waited=600),
    Failure("not-found-is-transient-here", NotFound("?"), "transient", 1.0),
]


@pytest.mark.parametrize("row", FAILURES, ids=lambda r: r.name)
def test_a_providers_error_comes_to_its_step(row: Failure) -> None:
    step = failed(
        POLICY,
        DELETE,
        list(row.answers),
        "delete",
        row.error,
        provider_id="pid-1",
        attempt=row.attempt,
        since=T0,
        now=T0 + timedelta(seconds=row.waited),
    )
    assert (step.outcome, step.retry, step.what) == (row.outcome, row.retry, row.what)
    if row.recorded is None:
        assert step.answer is None
        return
    assert isinstance(step.answer, ProviderFailed)
    assert step.answer.error_class is row.recorded
    assert (step.answer.command_id, step.answer.operation, step.answer.provider_id) == (
        "d1",
        "delete",
        "pid-1",
    )


def test_a_transient_failure_given_up_says_for_how_long() -> None:
    later = T0 + timedelta(seconds=601)
    step = failed(POLICY, CREATE, [], "create", Transient("503"), attempt=9, since=T0, now=later)
    assert isinstance(step.answer, ProviderFailed)
    assert step.answer.message == "create still failing after 601 s: 503"
    assert step.answer.provider_id == ""


@dataclass(frozen=True)
class Created:
    name: str
    state: InstanceState
    ip: str
    waited: float
    outcome: str
    answered: type | None
    retry: float | None = None


CREATED = [
    Created("running", InstanceState.RUNNING, "10.0.0.1", 0, "running", InstanceObserved),
    Created("running-late", InstanceState.RUNNING, "10.0.0.1", 9_999, "running", InstanceObserved),
    Created("running-without-address", InstanceState.RUNNING, "", 0, "pending", None, 0.5),
    Created("pending", InstanceState.PENDING, "", 10, "pending", None, 0.5),
    Created("stopped", InstanceState.STOPPED, "", 0, "stopped", InstanceObserved),
    Created("terminating", InstanceState.TERMINATING, "", 0, "terminating", InstanceObserved),
    Created("pending-almost-too-long", InstanceState.PENDING, "", 599, "pending", None, 0.5),
    Created("pending-too-long", InstanceState.PENDING, "", 600, "timeout", ProviderFailed),
]


@pytest.mark.parametrize("row", CREATED, ids=lambda r: r.name)
def test_a_created_instance_comes_to_its_step(row: Created) -> None:
    step = creating(
        POLICY,
        CREATE,
        "pid-1",
        instance(row.state, row.ip),
        attempt=1,
        since=T0,
        now=T0 + timedelta(seconds=row.waited),
    )
    assert (step.outcome, step.retry) == (row.outcome, row.retry)
    if row.answered is None:
        assert step.answer is None
        assert step.reason == f"instance {row.state}"
    else:
        assert type(step.answer) is row.answered


def test_a_create_timed_out_says_what_it_last_saw() -> None:
    step = creating(
        POLICY,
        CREATE,
        "pid-1",
        instance(InstanceState.PENDING),
        attempt=3,
        since=T0,
        now=T0 + timedelta(seconds=700),
    )
    assert step == Step(
        "timeout",
        ProviderFailed(
            command_id="c1",
            provider="p",
            operation="create",
            error_class=ErrorClass.TRANSIENT,
            message="not running after 700 s (limit 600 s); last state Pending",
            provider_id="pid-1",
        ),
        "timeout",
    )


def test_a_running_instance_is_the_creates_answer() -> None:
    running = instance(InstanceState.RUNNING, "10.0.0.1")
    step = creating(POLICY, CREATE, "pid-1", running, attempt=1, since=T0, now=T0)
    assert step == Step("running", observed("c1", "p", running), "observed-Running")


def test_the_created_record_is_the_commands_own() -> None:
    def rec(seq: int, command_id: str) -> Recorded:
        event = InstanceCreated(command_id=command_id, provider="p", provider_id=f"pid-{seq}")
        return Recorded(event, seq, "proxy.u1.instance", T0 + timedelta(seconds=seq))

    history = [rec(1, "c0"), rec(2, "c1"), rec(3, "c2")]
    found = created_record(history, "c1")
    assert found is not None
    assert (found.seq, found.timestamp) == (2, T0 + timedelta(seconds=2))
    assert created_record(history, "c9") is None
