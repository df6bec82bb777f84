"""The reconciler's fold of one proxy aggregate: everything a decision needs, nothing more.

Pure. The fold follows the command/answer protocol with the executor (``projections.commands``):
a command is *pending* from the moment it is appended until an answer carrying its command id
concludes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import msgspec

from events.schemas import (
    CreateInstance,
    DeleteInstance,
    ErrorClass,
    HealthChanged,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    ObserveInstance,
    PhaseChanged,
    ProviderFailed,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyRemoved,
    ProxySpec,
    ProxySpecChanged,
    ReplacementPromoted,
    ReplacementStarted,
    RotationEnded,
    RotationRequested,
)
from events.store import Recorded
from projections.commands import Pending, answered, answers, issued

replace = msgspec.structs.replace

VERSION = 2
"""The snapshot version of ``ProxyState`` (``states``): a new number for every change to what
the fold makes, as for the views in ``projections.versions``."""


class Replacement(msgspec.Struct, frozen=True, kw_only=True):
    """A make-before-break replacement under way
    (docs/decisions/0085-a-fresh-ip-without-downtime.md): the instance that will take over from the
    current one once it is Running and probed healthy."""

    rotation_id: str
    command_id: str
    reason: str = ""
    lease_id: str = ""
    instance_hash: str = ""
    provider: str = ""
    provider_id: str = ""
    state: InstanceState | None = None
    ip: str = ""
    url: str = ""
    gone: bool = False
    healthy: bool | None = None
    health_message: str = ""
    failure: str = ""
    """Why it cannot take over (its create failed, it stopped or vanished); "" while it can."""


class ProxyState(msgspec.Struct, frozen=True, kw_only=True):
    uid: str
    declared: bool = False
    namespace: str = ""
    name: str = ""
    spec: ProxySpec = msgspec.field(default_factory=ProxySpec)
    generation: int = 0
    cloud_init: str = ""
    deleting: bool = False
    removed: bool = False
    # The current instance, as the executor last reported it.
    instance_id: str = ""
    instance_provider: str = ""
    instance_hash: str = ""
    instance_state: InstanceState | None = None
    ip: str = ""
    url: str = ""
    had_instance: bool = False
    create_timed_out: bool = False
    pending: Pending | None = None
    commands: int = 0
    # A Permanent error latches Failed for the spec hash it happened under.
    failed_hash: str = ""
    failure: str = ""
    healthy: bool | None = None
    health_reason: str = ""
    health_message: str = ""
    unhealthy_since: datetime | None = None
    """JetStream time of the verdict that made an instance unhealthy; cleared by a new instance."""
    status: PhaseChanged | None = None
    last_seq: int = 0
    rotation_requested: str = ""
    """The id of a ``RotationRequested`` no replacement has started for yet."""
    rotation_lease: str = ""
    replacement: Replacement | None = None
    retiring_id: str = ""
    """The instance a promoted replacement took over from, until its ``InstanceGone``."""
    retiring_provider: str = ""
    retired_at: datetime | None = None
    """JetStream time of the promotion: the drain before the delete counts from it."""
    promoted_rotation: str = ""
    """The rotation of the last promotion: its lease switch is checked until the old instance
    is gone."""


def fold(uid: str, events: Iterable[Recorded], start: ProxyState | None = None) -> ProxyState:
    """The state after ``events``, folded on from ``start`` (the state as of the sequence before
    the first of them) or from nothing."""
    state = start or ProxyState(uid=uid)
    for recorded in events:
        state = replace(evolve(state, recorded), last_seq=recorded.seq)
    return state


def evolve(state: ProxyState, recorded: Recorded) -> ProxyState:
    rotated = _rotation(state, recorded)
    if rotated is not None:
        return rotated
    match recorded.event:
        case ProxyDeclared() as e:
            base = ProxyState(uid=state.uid, commands=state.commands) if state.removed else state
            return replace(
                base,
                declared=True,
                namespace=e.namespace,
                name=e.name,
                spec=e.spec,
                generation=e.generation,
                cloud_init=e.cloud_init_resolved,
            )
        case ProxySpecChanged() as e:
            # Any spec change releases a latched failure: the user has acted on it.
            return replace(
                state,
                spec=e.spec,
                generation=e.generation,
                cloud_init=e.cloud_init_resolved,
                failed_hash="",
                failure="",
            )
        case ProxyDeletionRequested():
            return replace(state, deleting=True)
        case ProxyRemoved():
            return replace(state, removed=True)
        case CreateInstance() as c:
            return replace(
                state,
                pending=issued(c),
                commands=state.commands + 1,
                instance_id="",
                instance_provider=c.provider,
                instance_hash=c.spec_hash,
                instance_state=None,
                ip="",
                url="",
                create_timed_out=False,
                healthy=None,
                health_reason="",
                health_message="",
                unhealthy_since=None,
            )
        case DeleteInstance() | ObserveInstance() as c:
            return replace(state, pending=issued(c), commands=state.commands + 1)
        case InstanceCreated() as a:
            return replace(state, instance_id=a.provider_id, had_instance=True)
        case InstanceObserved() as a:
            if a.provider_id != state.instance_id and not answers(state.pending, a):
                return state
            return replace(
                state,
                instance_id=a.provider_id,
                instance_state=a.state,
                ip=a.ip,
                url=a.url,
                had_instance=True,
                pending=answered(state.pending, a),
            )
        case InstanceGone() as a:
            if a.provider_id != state.instance_id and not answers(state.pending, a):
                return state
            if a.provider_id != state.instance_id and state.instance_id:
                # The delete of an instance that is no longer the proxy's (a cancelled
                # replacement): it concludes the command and changes nothing else.
                return replace(state, pending=answered(state.pending, a))
            return replace(
                state,
                instance_id="",
                instance_state=None,
                ip="",
                url="",
                pending=answered(state.pending, a),
            )
        case ProviderFailed() as a:
            return _failed(state, a)
        case HealthChanged() as h:
            if h.provider_id and h.provider_id != state.instance_id:
                return state  # a verdict on an instance already replaced
            since = state.unhealthy_since if state.healthy is False else recorded.timestamp
            return replace(
                state,
                healthy=h.healthy,
                health_reason=h.reason,
                health_message=h.message,
                unhealthy_since=None if h.healthy else since,
            )
        case PhaseChanged() as s:
            return replace(state, status=s)
        case _:
            return state


def _failed(state: ProxyState, a: ProviderFailed) -> ProxyState:
    if not answers(state.pending, a):
        return state
    pending = answered(state.pending, a)
    if pending is not None:
        # Not concluded (a quota refusal): the executor keeps retrying, the command stays out.
        return replace(state, pending=pending)
    match a.error_class:
        case ErrorClass.PERMANENT:
            return replace(
                state,
                pending=None,
                failed_hash=state.instance_hash if a.operation == "create" else "*",
                # "*": a delete that can never work latches whatever the spec
                failure=f"{a.operation}: {a.message}",
            )
        case _:
            # A final Transient answer: the instance never came up (create timeout).
            return replace(
                state,
                pending=None,
                create_timed_out=a.operation == "create",
                failure=f"{a.operation}: {a.message}",
            )


def _rotation(state: ProxyState, recorded: Recorded) -> ProxyState | None:
    """The state after an event of a make-before-break rotation, or about the replacement or
    the retiring instance; None for every other event (``evolve`` folds it as before)."""
    event = recorded.event
    r = state.replacement
    match event:
        case RotationRequested() as e:
            if r is not None or state.rotation_requested:
                return state  # one rotation at a time; the API answered with the one under way
            return replace(state, rotation_requested=e.rotation_id, rotation_lease=e.lease_id)
        case ReplacementStarted() as e:
            started = Replacement(
                rotation_id=e.rotation_id,
                command_id=e.command_id,
                reason=e.reason,
                lease_id=e.lease_id,
            )
            return replace(state, replacement=started, rotation_requested="", rotation_lease="")
        case ReplacementPromoted() as e:
            if r is None or r.rotation_id != e.rotation_id or not r.provider_id:
                return state
            return replace(
                state,
                instance_id=r.provider_id,
                instance_provider=r.provider,
                instance_hash=r.instance_hash,
                instance_state=r.state,
                ip=r.ip,
                url=r.url,
                had_instance=True,
                create_timed_out=False,
                healthy=r.healthy,
                health_reason="",
                health_message=r.health_message,
                unhealthy_since=None,
                replacement=None,
                retiring_id=state.instance_id,
                retiring_provider=state.instance_provider if state.instance_id else "",
                retired_at=recorded.timestamp if state.instance_id else None,
                promoted_rotation=e.rotation_id,
            )
        case RotationEnded() as e:
            if r is None or r.rotation_id != e.rotation_id:
                return state
            return replace(state, replacement=None)
        case CreateInstance() as c if r is not None and c.command_id == r.command_id:
            ours = replace(r, instance_hash=c.spec_hash, provider=c.provider)
            return replace(state, pending=issued(c), commands=state.commands + 1, replacement=ours)
        case CreateInstance() if state.rotation_requested:
            # No replacement (the instance was replaced delete-first, or is recreated): the new
            # instance is fresh anyway, so the rotation still waiting is satisfied.
            return evolve(replace(state, rotation_requested="", rotation_lease=""), recorded)
        case InstanceCreated() as a if r is not None and a.command_id == r.command_id:
            return replace(state, replacement=replace(r, provider_id=a.provider_id))
        case InstanceObserved() as a if r is not None and _about(r, a.command_id, a.provider_id):
            ours = replace(r, provider_id=a.provider_id, state=a.state, ip=a.ip, url=a.url)
            if a.state in (InstanceState.STOPPED, InstanceState.TERMINATING):
                ours = replace(ours, failure=f"the replacement is {a.state}")
            return replace(state, replacement=ours, pending=answered(state.pending, a))
        case InstanceGone() as a if r is not None and _about(r, a.command_id, a.provider_id):
            ours = replace(r, gone=True, failure=r.failure or "the replacement vanished")
            return replace(state, replacement=ours, pending=answered(state.pending, a))
        case InstanceGone() as a if state.retiring_id and a.provider_id == state.retiring_id:
            return replace(
                state,
                retiring_id="",
                retiring_provider="",
                retired_at=None,
                promoted_rotation="",
                pending=answered(state.pending, a),
            )
        case InstanceObserved() as a if state.retiring_id and a.provider_id == state.retiring_id:
            return replace(state, pending=answered(state.pending, a))
        case ProviderFailed() as a if r is not None and a.command_id == r.command_id:
            pending = answered(state.pending, a)
            if pending is not None:
                return replace(state, pending=pending)  # a quota refusal: still waiting
            failure = f"{a.operation}: {a.message}"
            return replace(state, pending=None, replacement=replace(r, failure=failure))
        case HealthChanged() as h if (
            r is not None and r.provider_id and (h.provider_id == r.provider_id)
        ):
            ours = replace(r, healthy=h.healthy, health_message=h.message)
            return replace(state, replacement=ours)
        case _:
            return None


def _about(r: Replacement, command_id: str, provider_id: str) -> bool:
    return command_id == r.command_id or (bool(r.provider_id) and provider_id == r.provider_id)
