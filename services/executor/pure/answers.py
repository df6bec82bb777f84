"""What one delivery of a command comes to, decided from what the handler read.

The handler (``services.executor.commands``) reads the command's answers so far, calls the
provider and reads the clock; the decisions are here, each a ``Step``: the answer to record (if
any), the outcome it counts, and the delay of the durable wait (None: the command is answered
and acked). The clock comes in as ``now``; the time a wait is measured from as ``since``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from events.schemas import (
    ErrorClass,
    InstanceCreated,
    InstanceObserved,
    InstanceState,
    ProviderFailed,
)
from events.store import Recorded
from projections.commands import Answer, Command
from services.executor.pure.policy import CommandPolicy
from services.providers.base import Instance, ProviderError

SETTLED = (InstanceState.STOPPED, InstanceState.TERMINATING)
"""States in which an instance will not become Running by waiting: the reconciler must act."""


@dataclass(frozen=True, slots=True)
class Step:
    """What a delivery does next: append ``answer`` (its msg id told apart by ``what``), count
    ``outcome``, then wait ``retry`` seconds for the next delivery, or (None) ack it."""

    outcome: str
    answer: Answer | None = None
    what: str = ""
    retry: float | None = None
    reason: str = ""
    """Why it waits (the delayed redelivery's note), with ``retry``."""


def observed(command_id: str, provider: str, instance: Instance) -> InstanceObserved:
    return InstanceObserved(
        command_id=command_id,
        provider=provider,
        provider_id=instance.provider_id,
        state=instance.state,
        ip=instance.ip,
        url=instance.url,
        instance_uid=instance.instance_uid,
        created_at=instance.created_at.isoformat(),
    )


def failure(
    command: Command,
    operation: str,
    error_class: ErrorClass,
    message: str,
    provider_id: str = "",
) -> ProviderFailed:
    return ProviderFailed(
        command_id=command.command_id,
        provider=command.provider,
        operation=operation,
        error_class=error_class,
        message=message,
        provider_id=provider_id,
    )


def created_record(history: Sequence[Recorded], command_id: str) -> Recorded | None:
    """The ``InstanceCreated`` answering the command: its timestamp starts the create timeout."""
    for recorded in history:
        event = recorded.event
        if isinstance(event, InstanceCreated) and event.command_id == command_id:
            return recorded
    return None


def waiting(policy: CommandPolicy, attempt: int, instance: Instance) -> Step:
    """The instance is on its way (or on its way out): poll it again."""
    return Step("pending", retry=policy.poll_delay(attempt), reason=f"instance {instance.state}")


def creating(
    policy: CommandPolicy,
    command: Command,
    provider_id: str,
    instance: Instance,
    *,
    attempt: int,
    since: datetime,
    now: datetime,
) -> Step:
    """The created instance ``provider_id`` as the provider shows it: running (with an
    address) or settled is the answer; anything else is waited for until ``create_timeout``
    from ``since`` (when the log recorded ``InstanceCreated``, so a restart does not reset
    it)."""
    state = instance.state
    if (state is InstanceState.RUNNING and instance.ip) or state in SETTLED:
        seen = observed(command.command_id, command.provider, instance)
        return Step(state.lower(), seen, f"observed-{state}")
    waited = (now - since).total_seconds()
    if waited >= policy.create_timeout:
        message = (
            f"not running after {waited:.0f} s (limit {policy.create_timeout:.0f} s); "
            f"last state {state}"
        )
        answer = failure(command, "create", ErrorClass.TRANSIENT, message, provider_id)
        return Step("timeout", answer, "timeout")
    return waiting(policy, attempt, instance)


def failed(
    policy: CommandPolicy,
    command: Command,
    answers: Sequence[Answer],
    operation: str,
    exc: ProviderError,
    *,
    provider_id: str = "",
    attempt: int,
    since: datetime,
    now: datetime,
) -> Step:
    """A provider call's error, by its class alone, as the reconciler will act on it:
    quota is recorded once per episode and retried slowly, permanent is the answer, and
    anything else (transient; NotFound where it is not an answer) is retried with back-off
    until ``retry_for`` from ``since`` (the command's timestamp), then answered Transient."""
    error_class = exc.error_class
    if error_class is ErrorClass.QUOTA_EXCEEDED:
        delay = max(policy.quota_delay, exc.retry_after)
        last = answers[-1] if answers else None
        if isinstance(last, ProviderFailed) and last.error_class is error_class:
            return Step("quota", retry=delay, reason=f"quota: {exc}")
        # The ordinal keeps a later, separate quota episode from being de-duplicated.
        answer = failure(command, operation, error_class, str(exc), provider_id)
        return Step("quota", answer, f"quota-{len(answers)}", delay, f"quota: {exc}")
    if error_class is ErrorClass.PERMANENT:
        answer = failure(command, operation, error_class, str(exc), provider_id)
        return Step("permanent", answer, f"failed-{operation}")
    waited = (now - since).total_seconds()
    if waited >= policy.retry_for:
        message = f"{operation} still failing after {waited:.0f} s: {exc}"
        answer = failure(command, operation, ErrorClass.TRANSIENT, message, provider_id)
        return Step("gave-up", answer, f"gave-up-{operation}")
    # A throttled API says when to come back: earlier calls would only be refused again.
    delay = max(policy.backoff(attempt), exc.retry_after)
    return Step("transient", retry=delay, reason=f"{error_class}: {exc}")
