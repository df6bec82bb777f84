"""Decisions: a pure function of the folded state, as the original operator's Reconcile was.

Level-triggered: the decision never depends on which event woke the reconciler, so a redelivered
event, a replica that folded a newer state, or a restart after a crash all decide the same thing.
Every id is derived from the state (uid + number of commands so far), so two replicas that decide
on the same state write the same msg ids and JetStream keeps one copy.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

from msgspec.structs import replace as msgspec_replace

from events.resource import spec_hash, validate_spec
from events.schemas import (
    Condition,
    CreateInstance,
    DeleteInstance,
    Event,
    InstanceCreated,
    InstanceState,
    ObserveInstance,
    Phase,
    PhaseChanged,
    ProxyMode,
    ProxyRemoved,
    ReplacementPromoted,
    ReplacementStarted,
    RotationEnded,
)
from services.reconciler.state import ProxyState, Replacement


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


def wakes(event: object) -> bool:
    """Whether an event can change a decision. ``InstanceCreated`` never concludes a command, so
    the decision it would wake is always "wait"; the answer that concludes the command wakes its
    own reconcile. Skipping it saves a whole-aggregate read per create (docs/benchmarks.md)."""
    return not isinstance(event, InstanceCreated)


def unhealthy_for(state: ProxyState, now: datetime) -> float:
    """Seconds the current instance has been unhealthy (0 when it is not)."""
    if state.healthy is not False or state.unhealthy_since is None:
        return 0.0
    return max(0.0, (now - state.unhealthy_since).total_seconds())


def decide(
    state: ProxyState,
    now: datetime | None = None,
    replace_unhealthy_after: float = 0.0,
    *,
    leased: bool = False,
    drain: float = 0.0,
) -> Decision:
    """``now`` and ``replace_unhealthy_after`` matter only for replacing an instance that has
    been unhealthy too long (off when 0), ``now`` and ``drain`` for when a rotated-out instance
    is deleted, and ``leased`` (a lease holds the proxy; the caller asks only when
    ``needs_lease``) for whether a spec change replaces make-before-break; everything else is a
    function of the state alone."""
    if not state.declared or state.removed:
        return NOTHING
    if state.pending is not None:
        return _waiting(state)
    if state.deleting:
        return _delete(state)
    errors = validate_spec(state.spec)
    if errors:
        message = "; ".join(str(e) for e in errors)
        if state.replacement is not None:
            return _cancel(state, state.replacement, "cancelled", "the spec is invalid")
        return _status(state, Phase.FAILED, "InvalidSpec", message, outcome="invalid")
    current = spec_hash(state.spec, state.cloud_init)
    if state.replacement is not None:
        return _rotating(state, state.replacement, current)
    if state.retiring_id and state.failed_hash != "*":  # "*": its delete can never work
        if retire_in(state, now, drain) > 0:
            return NOTHING  # the lease's holder moves over meanwhile (docs/decisions.md, D85)
        return _retire(state)
    if state.spec.mode is ProxyMode.EXTERNAL:
        return _external(state)
    if state.failed_hash in (current, "*"):
        return _status(state, Phase.FAILED, "ProviderError", state.failure, outcome="failed")
    if state.instance_id and _serving(state):
        if state.rotation_requested:
            return _start_rotation(state, current, state.rotation_requested, "Requested")
        if state.instance_hash != current and leased:
            rotation = f"{state.uid}-spec-{state.generation}-{state.commands + 1}"
            return _start_rotation(state, current, rotation, "SpecChanged")
    if state.instance_id:
        if (
            replace_unhealthy_after > 0
            and now is not None
            and unhealthy_for(state, now) >= replace_unhealthy_after
        ):
            return _replace(state, "Unhealthy")
        return _with_instance(state, current)
    return _create(state, current)


def _waiting(state: ProxyState) -> Decision:
    """A command is out; only the status may need to say why it takes long."""
    pending = state.pending
    assert pending is not None
    r = state.replacement
    if r is not None and pending.command_id == r.command_id:
        return NOTHING  # the current instance serves on: the status stays as it is
    if pending.quota_message:
        return _status(
            state,
            Phase.PROVISIONING,
            "QuotaExceeded",
            pending.quota_message,
            outcome="quota",
        )
    return NOTHING


def _delete(state: ProxyState) -> Decision:
    if state.replacement is not None:
        return _cancel(state, state.replacement, "cancelled", "the proxy is being deleted")
    if state.retiring_id:
        return Decision((_delete_retiring(state),), "delete")
    if state.instance_id:
        command = DeleteInstance(
            command_id=command_id(state),
            provider=state.instance_provider,
            provider_id=state.instance_id,
        )
        return _with_status(
            state, command, Phase.DELETING, "DeletingInstance", "", outcome="delete"
        )
    return Decision((ProxyRemoved(uid=state.uid),), "removed")


def _external(state: ProxyState) -> Decision:
    if state.instance_id:
        # Switched from Managed: the old instance goes first.
        return _replace(state, "ModeChanged")
    url = state.spec.external.url if state.spec.external is not None else ""
    return _status(state, Phase.READY, "External", "", url=url, outcome="ready")


def _with_instance(state: ProxyState, current: str) -> Decision:
    if state.instance_hash != current:
        return _replace(state, "SpecChanged")
    if state.create_timed_out:
        return _replace(state, "CreateTimedOut")
    if state.instance_state in (InstanceState.STOPPED, InstanceState.TERMINATING):
        return _replace(state, "InstanceStopped")
    if state.instance_state is InstanceState.RUNNING and state.ip:
        if state.healthy is False:
            # Still Ready (the instance runs), but the conditions say it fails its probes, and
            # discovery stops leasing it.
            return _status(
                state,
                Phase.READY,
                state.health_reason or "ProbeFailed",
                state.health_message,
                ip=state.ip,
                url=state.url,
                outcome="unhealthy",
            )
        return _status(
            state, Phase.READY, "InstanceRunning", "", ip=state.ip, url=state.url, outcome="ready"
        )
    # An instance in no known state and no command out (e.g. a lost answer): look at it again.
    command = ObserveInstance(
        command_id=command_id(state),
        provider=state.instance_provider,
        provider_id=state.instance_id,
    )
    return Decision((command,), "observe")


def _replace(state: ProxyState, reason: str) -> Decision:
    command = DeleteInstance(
        command_id=command_id(state),
        provider=state.instance_provider,
        provider_id=state.instance_id,
    )
    return _with_status(state, command, Phase.REPLACING, reason, "", outcome="replace")


def _create(state: ProxyState, current: str) -> Decision:
    command = CreateInstance(
        command_id=command_id(state),
        provider=state.spec.provider,
        instance_name=instance_name(state.uid, current),
        spec=state.spec,
        spec_hash=current,
        cloud_init=state.cloud_init,
    )
    reason = "Recreating" if state.had_instance else "Creating"
    return _with_status(state, command, Phase.PROVISIONING, reason, "", outcome="create")


def _with_status(
    state: ProxyState, command: Event, phase: Phase, reason: str, message: str, *, outcome: str
) -> Decision:
    status = _status(state, phase, reason, message, outcome=outcome)
    return Decision((command, *status.events), outcome)


def _status(
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


# ------------------------------------------------------------------- make-before-break (D85)


def needs_lease(state: ProxyState) -> bool:
    """Whether ``decide`` would ask whether the proxy is leased: its running instance no longer
    matches the spec, and nothing else comes first. The caller reads the proxy's lease subject
    only then, so a reconcile costs no extra read otherwise."""
    if not state.declared or state.removed or state.deleting or state.pending is not None:
        return False
    if state.replacement is not None or state.retiring_id or state.rotation_requested:
        return False
    if state.spec.mode is ProxyMode.EXTERNAL or validate_spec(state.spec):
        return False
    return (
        bool(state.instance_id)
        and _serving(state)
        and (state.instance_hash != spec_hash(state.spec, state.cloud_init))
    )


def retire_in(state: ProxyState, now: datetime | None, drain: float) -> float:
    """Seconds until the instance a rotation replaced may be deleted (0: now). Without a clock
    (``now`` None) or a drain, at once."""
    if not state.retiring_id or state.retired_at is None or now is None or drain <= 0:
        return 0.0
    return max(0.0, drain - (now - state.retired_at).total_seconds())


def rotated_name(uid: str, current: str, rotation_id: str) -> str:
    """A replacement's instance name: like ``instance_name`` (same shape, so every provider
    and the kvm leftover scan know it), but distinct from the instance it replaces, whose spec
    hash may be the same, and deterministic, so a repeated create finds it."""
    return instance_name(uid, hashlib.sha256(f"{current}:{rotation_id}".encode()).hexdigest())


def _serving(state: ProxyState) -> bool:
    """The current instance runs with an address: worth keeping while a replacement comes up."""
    return state.instance_state is InstanceState.RUNNING and bool(state.ip)


def _start_rotation(state: ProxyState, current: str, rotation_id: str, reason: str) -> Decision:
    cid = command_id(state)
    started = ReplacementStarted(
        rotation_id=rotation_id,
        command_id=cid,
        reason=reason,
        lease_id=state.rotation_lease if reason == "Requested" else "",
    )
    command = CreateInstance(
        command_id=cid,
        provider=state.spec.provider,
        instance_name=rotated_name(state.uid, current, rotation_id),
        spec=state.spec,
        spec_hash=current,
        cloud_init=state.cloud_init,
    )
    return Decision((started, command), "rotate")


def _rotating(state: ProxyState, r: Replacement, current: str) -> Decision:
    if state.spec.mode is ProxyMode.EXTERNAL:
        return _cancel(state, r, "cancelled", "the proxy became External")
    if r.instance_hash != current:
        return _cancel(state, r, "cancelled", "the spec changed during the rotation")
    if r.failure:
        return _cancel(state, r, "failed", r.failure)
    if r.healthy is False:
        message = f"the replacement failed its health probes: {r.health_message}".rstrip(": ")
        return _cancel(state, r, "failed", message)
    if r.state is InstanceState.RUNNING and r.ip:
        if r.healthy is True:
            return _promote(state, r)
        return NOTHING  # the health service probes it (projections.proxy.probe_target)
    if r.provider_id:
        # Created, in no known state and no command out (an observation was lost): look again.
        command = ObserveInstance(
            command_id=command_id(state), provider=r.provider, provider_id=r.provider_id
        )
        return Decision((command,), "observe")
    return _cancel(state, r, "failed", "the replacement was never created")


def _promote(state: ProxyState, r: Replacement) -> Decision:
    """The replacement takes over; the old instance is deleted later (``_retire``), after the
    lease switched and the drain is over."""
    promoted = ReplacementPromoted(
        rotation_id=r.rotation_id,
        provider_id=r.provider_id,
        retired_provider_id=state.instance_id,
        ip=r.ip,
        url=r.url,
    )
    after = msgspec_replace(
        state,
        instance_id=r.provider_id,
        instance_state=r.state,
        ip=r.ip,
        url=r.url,
        healthy=r.healthy,
        health_reason="",
        health_message=r.health_message,
    )
    status = _status(
        after, Phase.READY, "InstanceRunning", "", ip=r.ip, url=r.url, outcome="promote"
    )
    return Decision((promoted, *status.events), "promote")


def _cancel(state: ProxyState, r: Replacement, outcome: str, message: str) -> Decision:
    ended = RotationEnded(rotation_id=r.rotation_id, outcome=outcome, message=message)
    if r.provider_id and not r.gone:
        command = DeleteInstance(
            command_id=command_id(state), provider=r.provider, provider_id=r.provider_id
        )
        return Decision((command, ended), "rotation_" + outcome)
    return Decision((ended,), "rotation_" + outcome)


def _delete_retiring(state: ProxyState) -> DeleteInstance:
    return DeleteInstance(
        command_id=command_id(state),
        provider=state.retiring_provider,
        provider_id=state.retiring_id,
    )


def _retire(state: ProxyState) -> Decision:
    return Decision((_delete_retiring(state),), "retire")
