"""The command/answer protocol between the reconciler and the executor.

The reconciler appends a command to ``proxy.<uid>.cmd`` and waits; the executor answers with
instance events that carry the command's id. A command is *pending* from its append until an
answer *concludes* it. Every answer concludes its command except two:

- ``InstanceCreated``: the instance exists but does not run yet, and the executor goes on waiting;
- a ``ProviderFailed`` of class ``QuotaExceeded``: the executor keeps retrying slowly, and the event
  only tells the reconciler (and the operator) why the command takes long.

The executor stops working on a command once it is concluded, and the reconciler decides again
only then; if the two disagreed, one would wait for ever on a command the other had dropped. So
the rule is written once, here, and both sides read it.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

from events.schemas import (
    CreateInstance,
    DeleteInstance,
    ErrorClass,
    Event,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    ObserveInstance,
    ProviderFailed,
)
from events.store import Recorded

Command = CreateInstance | DeleteInstance | ObserveInstance
"""What the reconciler asks for (``proxy.<uid>.cmd``)."""
Answer = InstanceCreated | InstanceObserved | InstanceGone | ProviderFailed
"""What the executor records about a command (``proxy.<uid>.instance``)."""

Kind = Literal["create", "delete", "observe"]


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """A command that is out and not concluded yet."""

    command_id: str
    kind: Kind
    provider: str
    provider_id: str = ""
    quota_message: str = ""
    """Why it waits, while the provider refuses it for quota; "" otherwise."""


def concludes(answer: Event) -> bool:
    """Whether an answer ends its command (anything that is not an answer ends nothing)."""
    match answer:
        case InstanceObserved() | InstanceGone():
            return True
        case ProviderFailed(error_class=error_class):
            return error_class is not ErrorClass.QUOTA_EXCEEDED
        case _:
            return False


def answers_to(events: Iterable[Recorded], command_id: str) -> list[Answer]:
    """Every answer recorded for one command, oldest first."""
    return [
        r.event for r in events if isinstance(r.event, Answer) and r.event.command_id == command_id
    ]


def issued(command: Command) -> Pending:
    """The command just appended, as the pending one."""
    match command:
        case CreateInstance(command_id=cid, provider=provider):
            return Pending(command_id=cid, kind="create", provider=provider)
        case DeleteInstance(command_id=cid, provider=provider, provider_id=pid):
            return Pending(command_id=cid, kind="delete", provider=provider, provider_id=pid)
        case ObserveInstance(command_id=cid, provider=provider, provider_id=pid):
            return Pending(command_id=cid, kind="observe", provider=provider, provider_id=pid)


def answers(pending: Pending | None, answer: Answer) -> bool:
    """Whether ``answer`` is about the pending command (not an earlier, concluded one)."""
    return pending is not None and pending.command_id == answer.command_id


def answered(pending: Pending | None, answer: Answer) -> Pending | None:
    """The pending command after an answer: None once concluded, unchanged by an answer about
    another command, and noting the message of a quota refusal."""
    if pending is None or not answers(pending, answer):
        return pending
    if concludes(answer):
        return None
    if isinstance(answer, ProviderFailed):
        return msgspec.structs.replace(pending, quota_message=answer.message)
    return pending
