"""What a decision is, and the parts every decider builds one from: the ids of its commands and
the status it reports. Shared by ``decide`` and ``decide_rotate``, which import it (not each other's
helpers), so that neither imports the other back.
"""

from __future__ import annotations

from dataclasses import dataclass

from events.schemas import Condition, Event, InstanceState, Phase, PhaseChanged, ProxyMode
from services.reconciler.pure.view import ProxyState


@dataclass(frozen=True, slots=True)
class Decision:
    """What to append, and a name for the metrics and the trace (``outcome``)."""

    events: tuple[Event, ...]
    outcome: str


NOTHING = Decision((), "noop")


def instance_name(uid: str, hash_: str) -> str:
    """Deterministic, so a repeated create finds the existing instance; the spec hash is part of
    it so a replacement never collides with the instance it replaces. Fits GCE's 63 chars."""
    return f"px-{uid.lower()}-{hash_[:8]}"


def command_id(state: ProxyState) -> str:
    return f"{state.uid}-c{state.commands + 1}"


def status_change(
    state: ProxyState,
    phase: Phase,
    reason: str,
    message: str,
    *,
    ip: str = "",
    url: str = "",
    outcome: str,
) -> Decision:
    """A status event only when something a reader sees would change (facts, not polls)."""
    changed = PhaseChanged(
        phase=phase,
        reason=reason,
        message=message,
        ip=ip,
        url=url,
        provider_id=state.instance_id,
        observed_generation=state.generation,
        conditions=conditions(state, phase, reason, message),
    )
    previous = state.status
    if previous is not None and _same(previous, changed):
        return NOTHING
    return Decision((changed,), outcome)


def _same(a: PhaseChanged, b: PhaseChanged) -> bool:
    return (a.phase, a.reason, a.message, a.ip, a.url, a.provider_id, a.observed_generation) == (
        b.phase,
        b.reason,
        b.message,
        b.ip,
        b.url,
        b.provider_id,
        b.observed_generation,
    )


def conditions(state: ProxyState, phase: Phase, reason: str, message: str) -> tuple[Condition, ...]:
    ready = phase is Phase.READY
    provisioned = bool(state.instance_id) and state.instance_state is InstanceState.RUNNING
    result = [
        Condition(type="Ready", status=str(ready), reason=reason, message=message),
        Condition(
            type="Provisioned",
            status=str(provisioned or state.spec.mode is ProxyMode.EXTERNAL),
            reason="InstanceRunning" if provisioned else reason,
        ),
    ]
    if state.healthy is not None:
        result.append(
            Condition(
                type="Healthy",
                status=str(state.healthy),
                reason=state.health_reason
                or ("ProbeSucceeded" if state.healthy else "ProbeFailed"),
                message=state.health_message,
            )
        )
    return tuple(result)
