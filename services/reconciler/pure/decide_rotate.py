"""Make-before-break rotation decisions (docs/decisions/0085-a-fresh-ip-without-downtime.md): start
a replacement, follow it until it is Ready and healthy, promote it or give it up, and delete the
instance it replaced once the drain is over. Pure, like ``decide``, which calls these.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from msgspec.structs import replace as msgspec_replace

from events.proxyresource import spec_hash, validate_spec
from events.schemas import (
    CreateInstance,
    DeleteInstance,
    InstanceState,
    ObserveInstance,
    Phase,
    ProxyMode,
    ReplacementPromoted,
    ReplacementStarted,
    RotationEnded,
)
from projections.rotation import Replacement
from services.reconciler.pure.decision import (
    NOTHING,
    Decision,
    command_id,
    instance_name,
    status_change,
)
from services.reconciler.pure.view import ProxyState


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
        and serving(state)
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


def serving(state: ProxyState) -> bool:
    """The current instance runs with an address: worth keeping while a replacement comes up."""
    return state.instance_state is InstanceState.RUNNING and bool(state.ip)


def start_rotation(state: ProxyState, current: str, rotation_id: str, reason: str) -> Decision:
    cid = command_id(state)
    started = ReplacementStarted(
        rotation_id=rotation_id,
        command_id=cid,
        reason=reason,
        lease_id=state.rotation_lease if reason == "Requested" else "",
    )
    return Decision((started, _create(state, current, rotation_id, cid)), "rotate")


def _create(state: ProxyState, current: str, rotation_id: str, cid: str) -> CreateInstance:
    return CreateInstance(
        command_id=cid,
        provider=state.spec.provider,
        instance_name=rotated_name(state.uid, current, rotation_id),
        spec=state.spec,
        spec_hash=current,
        cloud_init=state.cloud_init,
    )


def rotating(state: ProxyState, r: Replacement, current: str) -> Decision:
    if state.spec.mode is ProxyMode.EXTERNAL:
        return cancel(state, r, "cancelled", "the proxy became External")
    if not r.instance_hash and not r.provider_id:
        # Started in half: the store appends a decision's events one by one, and another
        # writer's append between them refused the CreateInstance. Issue it now.
        return Decision((_create(state, current, r.rotation_id, r.command_id),), "rotate")
    if r.instance_hash != current:
        return cancel(state, r, "cancelled", "the spec changed during the rotation")
    if r.failure:
        return cancel(state, r, "failed", r.failure)
    if r.healthy is False:
        message = f"the replacement failed its health probes: {r.health_message}".rstrip(": ")
        return cancel(state, r, "failed", message)
    if r.state == InstanceState.RUNNING and r.ip:
        if r.healthy is True:
            return _promote(state, r)
        return NOTHING  # the health service probes it (projections.proxy.probe_target)
    if r.provider_id:
        # Created, in no known state and no command out (an observation was lost): look again.
        command = ObserveInstance(
            command_id=command_id(state), provider=r.provider, provider_id=r.provider_id
        )
        return Decision((command,), "observe")
    return cancel(state, r, "failed", "the replacement was never created")


def _promote(state: ProxyState, r: Replacement) -> Decision:
    """The replacement takes over; the old instance is deleted later (``retire``), after the
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
        instance_state=r.instance_state,
        ip=r.ip,
        url=r.url,
        healthy=r.healthy,
        health_reason="",
        health_message=r.health_message,
    )
    status = status_change(
        after, Phase.READY, "InstanceRunning", "", ip=r.ip, url=r.url, outcome="promote"
    )
    return Decision((promoted, *status.events), "promote")


def cancel(state: ProxyState, r: Replacement, outcome: str, message: str) -> Decision:
    ended = RotationEnded(rotation_id=r.rotation_id, outcome=outcome, message=message)
    if r.provider_id and not r.gone:
        command = DeleteInstance(
            command_id=command_id(state), provider=r.provider, provider_id=r.provider_id
        )
        return Decision((command, ended), "rotation_" + outcome)
    return Decision((ended,), "rotation_" + outcome)


def delete_retiring(state: ProxyState) -> DeleteInstance:
    return DeleteInstance(
        command_id=command_id(state),
        provider=state.retiring_provider,
        provider_id=state.retiring_id,
    )


def retire(state: ProxyState) -> Decision:
    return Decision((delete_retiring(state),), "retire")
