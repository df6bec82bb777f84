"""Decisions: a pure function of the folded state, as the original operator's Reconcile was.

Level-triggered: the decision never depends on which event woke the reconciler, so a redelivered
event, a replica that folded a newer state, or a restart after a crash all decide the same thing.
Every id is derived from the state (uid + number of commands so far), so two replicas that decide
on the same state write the same msg ids and JetStream keeps one copy.

``decide`` is the entry point; the make-before-break rotation it may be in the middle of is
decided in ``decide_rotate``, and what a decision is (and the status it reports) in ``decision``.
``revisit`` says when to decide again though no event wakes the proxy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from events.proxyresource import spec_hash, validate_spec
from events.schemas import (
    CreateInstance,
    DeleteInstance,
    Event,
    InstanceCreated,
    InstanceState,
    ObserveInstance,
    Phase,
    ProxyMode,
    ProxyRemoved,
)
from services.reconciler.pure.decide_rotate import (
    cancel,
    delete_retiring,
    retire,
    retire_in,
    rotating,
    serving,
    start_rotation,
)
from services.reconciler.pure.decision import (
    NOTHING,
    Decision,
    command_id,
    instance_name,
    status_change,
)
from services.reconciler.pure.view import ProxyState

WAKING = ("declared", "instance", "health", "rotate")
"""The categories whose events can change a decision. The reconciler's own (``cmd``, ``status``)
record decisions already made; ``egress`` facts act through the health service's rotate requests.
"""


def wakes(event: object) -> bool:
    """Whether an event can change a decision. ``InstanceCreated`` never concludes a command, so
    the decision it would wake is always "wait"; the answer that concludes the command wakes its
    own reconcile. Skipping it saves a whole-aggregate read per create (docs/benchmarks.md)."""
    return kind_wakes(type(event))


def kind_wakes(kind: type) -> bool:
    return getattr(kind, "category", "") in WAKING and kind is not InstanceCreated


def unhealthy_for(state: ProxyState, now: datetime) -> float:
    """Seconds the current instance has been unhealthy (0 when it is not)."""
    if state.healthy is not False or state.unhealthy_since is None:
        return 0.0
    return max(0.0, (now - state.unhealthy_since).total_seconds())


@dataclass(frozen=True, slots=True)
class Later:
    """Decide on the proxy again in ``delay`` seconds; ``reason`` names the wait."""

    delay: float
    reason: str


SLACK = 0.05
"""Seconds past the end of a wait: the decision made then finds the wait over."""


def revisit(
    state: ProxyState,
    decision: Decision,
    now: datetime,
    replace_unhealthy_after: float = 0.0,
    *,
    drain: float = 0.0,
) -> Later | None:
    """When to decide again on a proxy no event will wake (None: only an event will), given the
    state ``decision`` was made on. The service makes it a delayed redelivery of the message it
    is handling, so a wait survives a crash (no in-memory timer):

    - after a promotion, when the drain is over: the old instance is deleted then;
    - while a promoted replacement's old instance waits out its drain, when the drain is over;
    - while the instance is unhealthy but not yet for ``replace_unhealthy_after`` seconds, when
      it will have been (unless this decision already replaces it)."""
    if decision.outcome == "promote":
        return Later(drain + SLACK, "draining")
    if state.retiring_id and state.pending is None and decision.outcome == "noop":
        return Later(retire_in(state, now, drain) + SLACK, "draining")
    if replace_unhealthy_after > 0 and decision.outcome != "replace":
        unhealthy = unhealthy_for(state, now)
        if unhealthy > 0:
            return Later(replace_unhealthy_after - unhealthy + SLACK, "unhealthy")
    return None


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
            return cancel(state, state.replacement, "cancelled", "the spec is invalid")
        return status_change(state, Phase.FAILED, "InvalidSpec", message, outcome="invalid")
    current = spec_hash(state.spec, state.cloud_init)
    if state.replacement is not None:
        return rotating(state, state.replacement, current)
    if state.retiring_id and state.failed_hash != "*":  # "*": its delete can never work
        if retire_in(state, now, drain) > 0:
            # The lease's holder moves over meanwhile
            # (docs/decisions/0085-a-fresh-ip-without-downtime.md).
            return NOTHING
        return retire(state)
    if state.spec.mode is ProxyMode.EXTERNAL:
        return _external(state)
    if state.failed_hash in (current, "*"):
        return status_change(state, Phase.FAILED, "ProviderError", state.failure, outcome="failed")
    if state.instance_id and serving(state):
        if state.rotation_requested:
            return start_rotation(state, current, state.rotation_requested, "Requested")
        if state.instance_hash != current and leased:
            rotation = f"{state.uid}-spec-{state.generation}-{state.commands + 1}"
            return start_rotation(state, current, rotation, "SpecChanged")
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
        return status_change(
            state,
            Phase.PROVISIONING,
            "QuotaExceeded",
            pending.quota_message,
            outcome="quota",
        )
    return NOTHING


def _delete(state: ProxyState) -> Decision:
    if state.replacement is not None:
        return cancel(state, state.replacement, "cancelled", "the proxy is being deleted")
    if state.retiring_id:
        return Decision((delete_retiring(state),), "delete")
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
    return status_change(state, Phase.READY, "External", "", url=url, outcome="ready")


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
            return status_change(
                state,
                Phase.READY,
                state.health_reason or "ProbeFailed",
                state.health_message,
                ip=state.ip,
                url=state.url,
                outcome="unhealthy",
            )
        return status_change(
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
    status = status_change(state, phase, reason, message, outcome=outcome)
    return Decision((command, *status.events), outcome)
