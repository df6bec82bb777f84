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
)
from events.store import Recorded
from projections.commands import Pending, answered, answers, issued

replace = msgspec.structs.replace

VERSION = 1
"""The snapshot version of ``ProxyState`` (``states``): a new number for every change to what
the fold makes, as for the views in ``projections.versions``."""


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


def fold(uid: str, events: Iterable[Recorded], start: ProxyState | None = None) -> ProxyState:
    """The state after ``events``, folded on from ``start`` (the state as of the sequence before
    the first of them) or from nothing."""
    state = start or ProxyState(uid=uid)
    for recorded in events:
        state = replace(evolve(state, recorded), last_seq=recorded.seq)
    return state


def evolve(state: ProxyState, recorded: Recorded) -> ProxyState:
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
