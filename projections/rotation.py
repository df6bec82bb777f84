"""A proxy's make-before-break rotations (docs/decisions/0085-a-fresh-ip-without-downtime.md),
folded once for every reader.

Pure. The proxy view (``projections.proxy``) and the reconciler's view of an aggregate
(``services.reconciler.pure.view``) both keep a proxy's latest ``Rotation`` and the ``Replacement``
it brings up, and both fold them here: what a rotation event, or an answer or a verdict about
the replacement, means is written once, so the API's answer to a rotation and the reconciler's
decision about it cannot disagree. ``step`` says what the event was to the rotation (``Turn``);
what that does to the rest of each reader's state (the instance the proxy now has, the command
still out) is the reader's own fold.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import msgspec

from events.schemas import (
    CreateInstance,
    HealthChanged,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    ProviderFailed,
    ReplacementPromoted,
    ReplacementStarted,
    RotationEnded,
    RotationRequested,
)
from events.store import Recorded

GONE = "Gone"
"""An instance's state once the provider answered NotFound for it."""

REQUESTED = "requested"
CREATING = "creating"
PROBING = "probing"
COMPLETED = "completed"
IN_PROGRESS = (REQUESTED, CREATING, PROBING)


class Rotation(msgspec.Struct, frozen=True, kw_only=True):
    """The proxy's latest rotation, as ``POST /v1/leases/{id}/rotate`` answers it."""

    rotation_id: str
    lease_id: str = ""
    reason: str = ""
    state: str = REQUESTED
    """``requested``, ``creating``, ``probing``, ``completed``, or a ``RotationEnded`` outcome
    (``failed``, ``cancelled``)."""
    message: str = ""
    requested_at: datetime | None = None
    ended_at: datetime | None = None

    @property
    def in_progress(self) -> bool:
        return self.state in IN_PROGRESS


class Replacement(msgspec.Struct, frozen=True, kw_only=True):
    """The instance a rotation is bringing up: the health service probes it
    (``projections.proxy.probe_target``) while the proxy and its lease still go through the
    current one, and it takes over once it is Running and probed healthy."""

    rotation_id: str
    command_id: str = ""
    """The ``CreateInstance`` that makes it: its answers are about the replacement."""
    instance_hash: str = ""
    provider: str = ""
    provider_id: str = ""
    state: str = ""
    """Empty until it is observed, then the last observed ``InstanceState``, or ``GONE``."""
    ip: str = ""
    url: str = ""
    gone: bool = False
    """The provider said it is gone: it is never deleted again, even if observed later."""
    verdict: HealthChanged | None = None
    """The last verdict about the replacement."""
    failure: str = ""
    """Why it cannot take over (it stopped or vanished, or its create failed); "" while it can.
    A failed create counts only once the command is concluded, which the reconciler knows and
    the proxy view does not, so the view leaves ``ProviderFailed`` to the reconciler (the
    ``failed`` turn)."""

    @property
    def healthy(self) -> bool | None:
        return self.verdict.healthy if self.verdict is not None else None

    @property
    def health_message(self) -> str:
        return self.verdict.message if self.verdict is not None else ""

    @property
    def instance_state(self) -> InstanceState | None:
        """``state`` as the instance state the replacement hands over when it takes over."""
        try:
            return InstanceState(self.state)
        except ValueError:
            return None


Turn = Literal[
    "request", "start", "promote", "end", "command", "fresh", "answer", "failed", "other"
]
"""What an event was to the rotation:

- ``request``, ``start``, ``end``: a rotation asked for, its replacement started, given up;
- ``promote``: the replacement (the one before the event) takes over the proxy;
- ``command``: the replacement's ``CreateInstance``, now the command that is out;
- ``fresh``: a ``CreateInstance`` of the proxy's own instance, which satisfies the rotation
  still waiting; the reader then folds the event as any other create;
- ``answer``: an observation or a ``InstanceGone`` that answers a command about the replacement;
- ``failed``: a ``ProviderFailed`` of the replacement's create (``Replacement.failure`` is set:
  it counts once the command is concluded);
- ``other``: created, or a verdict about it.
"""


@dataclass(frozen=True, slots=True)
class Step:
    rotation: Rotation | None
    replacement: Replacement | None
    turn: Turn


def step(rotation: Rotation | None, r: Replacement | None, recorded: Recorded) -> Step | None:
    """The rotation and the replacement after an event of a rotation or about its replacement;
    None for every other event (the reader folds it as before)."""
    at = recorded.timestamp
    replace = msgspec.structs.replace
    match recorded.event:
        case RotationRequested() as e:
            if rotation is not None and rotation.in_progress:
                return None  # one at a time: the API answered with the one under way
            requested = Rotation(rotation_id=e.rotation_id, lease_id=e.lease_id, requested_at=at)
            return Step(requested, r, "request")
        case ReplacementStarted() as e:
            same = rotation is not None and rotation.rotation_id == e.rotation_id
            started = Rotation(
                rotation_id=e.rotation_id,
                lease_id=e.lease_id,
                reason=e.reason,
                state=CREATING,
                requested_at=rotation.requested_at if rotation is not None and same else at,
            )
            ours = Replacement(rotation_id=e.rotation_id, command_id=e.command_id)
            return Step(started, ours, "start")
        case ReplacementPromoted() as e if r is not None and r.rotation_id == e.rotation_id:
            done = _ended(rotation, e.rotation_id, state=COMPLETED, ended_at=at)
            return Step(done, None, "promote")
        case RotationEnded() as e if r is not None and r.rotation_id == e.rotation_id:
            ended = _ended(rotation, e.rotation_id, state=e.outcome, message=e.message, ended_at=at)
            return Step(ended, None, "end")
        case CreateInstance() as c if r is not None and c.command_id == r.command_id:
            ours = replace(r, instance_hash=c.spec_hash, provider=c.provider)
            return Step(rotation, ours, "command")
        case CreateInstance() if rotation is not None and rotation.state == REQUESTED:
            # Replaced delete-first, or recreated: the new instance is fresh anyway.
            return Step(replace(rotation, state=COMPLETED, ended_at=at), r, "fresh")
        case InstanceCreated() as a if r is not None and a.command_id == r.command_id:
            return Step(rotation, replace(r, provider_id=a.provider_id), "other")
        case InstanceObserved() as a if r is not None and _about(r, a.command_id, a.provider_id):
            ours = replace(r, provider_id=a.provider_id, state=str(a.state), ip=a.ip, url=a.url)
            if a.state in (InstanceState.STOPPED, InstanceState.TERMINATING):
                ours = replace(ours, failure=f"the replacement is {a.state}")
            return Step(_moved(rotation, ours), ours, "answer")
        case InstanceGone() as a if r is not None and _about(r, a.command_id, a.provider_id):
            failure = r.failure or "the replacement vanished"
            ours = replace(r, state=GONE, gone=True, failure=failure)
            return Step(rotation, ours, "answer")
        case ProviderFailed() as a if r is not None and a.command_id == r.command_id:
            return Step(rotation, replace(r, failure=f"{a.operation}: {a.message}"), "failed")
        case HealthChanged() as h if (
            r is not None and r.provider_id and (h.provider_id == r.provider_id)
        ):
            return Step(rotation, replace(r, verdict=h), "other")
        case _:
            return None


def requested(rotation: Rotation | None) -> Rotation | None:
    """The rotation asked for that no replacement has started for yet, if any."""
    return rotation if rotation is not None and rotation.state == REQUESTED else None


def _about(r: Replacement, command_id: str, provider_id: str) -> bool:
    return command_id == r.command_id or (bool(r.provider_id) and provider_id == r.provider_id)


def _ended(rotation: Rotation | None, rotation_id: str, **changes: object) -> Rotation | None:
    """The latest rotation once ``rotation_id`` is over (it stays as it was if it is another)."""
    if rotation is None or rotation.rotation_id != rotation_id:
        return rotation
    return msgspec.structs.replace(rotation, **changes)


def _moved(rotation: Rotation | None, r: Replacement) -> Rotation | None:
    """A rotation whose replacement runs is being probed."""
    if rotation is None or rotation.rotation_id != r.rotation_id or not rotation.in_progress:
        return rotation
    return msgspec.structs.replace(
        rotation, state=PROBING if r.state == InstanceState.RUNNING else CREATING
    )
