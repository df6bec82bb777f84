"""The reconciler's view of one proxy aggregate: everything a decision needs, nothing more.

Pure. The fold follows the command/answer protocol with the executor (``projections.commands``):
a command is *pending* from the moment it is appended until an answer carrying its command id
concludes it. A make-before-break rotation is folded by the shared ``projections.rotation``, as
for the proxy view; what it does to the instance and the command out is folded here.

The facts this state shares with the proxy view (``projections.proxy``) are held equal to it
over generated histories, not derived from it: the view keeps the last fact about any instance,
this the instance its commands made
(docs/decisions/0146-one-proxy-history-two-folds-held-together.md).
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
)
from events.store import Recorded
from projections.commands import Pending, answered, answers, issued
from projections.rotation import Replacement, Rotation, Step, requested, step

replace = msgspec.structs.replace

VERSION = 5
"""The snapshot version of ``ProxyState`` (``cache``): a new number for every change to what
the fold makes, as for the views in ``projections.versions``. The state holds the rotation's
structs of ``projections.rotation``, so a change there takes a new number here and for the
proxy view alike (``tests/unit/test_snapshot_versions.py`` checks both shapes)."""


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
    rotation: Rotation | None = None
    """The latest rotation, under way or over (``projections.rotation``)."""
    replacement: Replacement | None = None
    """The instance a make-before-break rotation brings up
    (docs/decisions/0085-a-fresh-ip-without-downtime.md)."""
    retiring_id: str = ""
    """The instance a promoted replacement took over from, until its ``InstanceGone``."""
    retiring_provider: str = ""
    retired_at: datetime | None = None
    """JetStream time of the promotion: the drain before the delete counts from it."""
    promoted_rotation: str = ""
    """The rotation of the last promotion: its lease switch is checked until the old instance
    is gone."""

    @property
    def rotation_requested(self) -> str:
        """The id of a ``RotationRequested`` no replacement has started for yet ("": none)."""
        asked = requested(self.rotation)
        return asked.rotation_id if asked is not None else ""

    @property
    def rotation_lease(self) -> str:
        """The lease whose holder asked for that rotation."""
        asked = requested(self.rotation)
        return asked.lease_id if asked is not None else ""


def fold(uid: str, events: Iterable[Recorded], start: ProxyState | None = None) -> ProxyState:
    """The state after ``events``, folded on from ``start`` (the state as of the sequence before
    the first of them) or from nothing."""
    state = start or ProxyState(uid=uid)
    for recorded in events:
        state = replace(evolve(state, recorded), last_seq=recorded.seq)
    return state


def evolve(state: ProxyState, recorded: Recorded) -> ProxyState:
    if not state.declared and not isinstance(recorded.event, ProxyDeclared):
        # A proxy exists from its declaration: what comes before it is skipped, as the proxy
        # view skips it (``projections.proxy.Undeclared``).
        return state
    turned = step(state.rotation, state.replacement, recorded)
    if turned is not None:
        return _rotated(state, turned, recorded)
    retired = _retiring(state, recorded)
    if retired is not None:
        return retired
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
            return replace(state, removed=True, deleting=True)
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


def _rotated(state: ProxyState, turned: Step, recorded: Recorded) -> ProxyState:
    """The state after an event of a rotation or about its replacement, which
    ``projections.rotation`` folded: what it does to the command out and the instance."""
    after = replace(state, rotation=turned.rotation, replacement=turned.replacement)
    match turned.turn, recorded.event, state.replacement:
        case "command", CreateInstance() as c, _:
            return replace(after, pending=issued(c), commands=state.commands + 1)
        case "fresh", _, _:
            # No replacement (replaced delete-first, or recreated): the rotation still waiting
            # is satisfied, and the create is folded as any other.
            return evolve(after, recorded)
        case "answer", InstanceObserved() | InstanceGone() as a, _:
            return replace(after, pending=answered(state.pending, a))
        case "failed", ProviderFailed() as a, _:
            pending = answered(state.pending, a)
            if pending is not None:
                return replace(state, pending=pending)  # a quota refusal: still waiting
            return replace(after, pending=None)
        case "promote", ReplacementPromoted(), Replacement(provider_id=""):
            # A replacement never created has nothing to hand over: the reconciler promotes
            # only one it saw Running, so only a log it did not write gets here.
            return state
        case "promote", ReplacementPromoted() as e, Replacement() as r:
            return replace(
                after,
                instance_id=r.provider_id,
                instance_provider=r.provider,
                instance_hash=r.instance_hash,
                instance_state=r.instance_state,
                ip=r.ip,
                url=r.url,
                had_instance=True,
                create_timed_out=False,
                healthy=r.healthy,
                health_reason="",
                health_message=r.health_message,
                unhealthy_since=None,
                retiring_id=state.instance_id,
                retiring_provider=state.instance_provider if state.instance_id else "",
                retired_at=recorded.timestamp if state.instance_id else None,
                promoted_rotation=e.rotation_id,
            )
        case _:
            return after


def _retiring(state: ProxyState, recorded: Recorded) -> ProxyState | None:
    """The state after an answer about the instance a promoted replacement took over from;
    None for every other event."""
    match recorded.event:
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
        case _:
            return None
