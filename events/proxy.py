"""The events of a Proxy's aggregate (``proxy.<uid>.<category>``): what people declared, what the
reconciler asks the executor and what the executor answers, health transitions and the phase the
reconciler decided, in that order; with the rotation and egress events (``events.rotation``,
``events.egress``), the ``ProxyEvent`` union the Proxy's folds read (docs/architecture.md,
"The event log"). Every type is also named from ``events.schemas``, where the union of all is.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

import msgspec

from events.base import Event
from events.egress import EgressChanged, EgressObserved
from events.rotation import (
    ReplacementPromoted,
    ReplacementStarted,
    RotationEnded,
    RotationRequested,
)
from events.spec import ProxySpec

# --------------------------------------------------------------------------------------------
# proxy.<uid>.declared — what people asked for (watcher, CLI)


class ProxyDeclared(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "declared"
    uid: str
    namespace: str
    name: str
    spec: ProxySpec
    generation: int = 1
    source: str = "cli"
    cloud_init_resolved: str = ""


class ProxySpecChanged(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "declared"
    uid: str
    spec: ProxySpec
    generation: int = 1
    cloud_init_resolved: str = ""


class ProxyDeletionRequested(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "declared"
    uid: str


class ProxyRemoved(Event, frozen=True, kw_only=True):
    """The last event of an aggregate: its instance is gone and nothing more will happen."""

    category: ClassVar[str] = "declared"
    uid: str


# --------------------------------------------------------------------------------------------
# proxy.<uid>.cmd — what the reconciler asks the executor to do


class CreateInstance(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "cmd"
    command_id: str
    provider: str
    instance_name: str
    spec: ProxySpec
    spec_hash: str = ""
    cloud_init: str = ""


class ObserveInstance(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "cmd"
    command_id: str
    provider: str
    provider_id: str


class DeleteInstance(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "cmd"
    command_id: str
    provider: str
    provider_id: str


# --------------------------------------------------------------------------------------------
# proxy.<uid>.instance — what the executor did and saw


class InstanceState(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    STOPPED = "Stopped"
    TERMINATING = "Terminating"
    UNKNOWN = "Unknown"


class ErrorClass(StrEnum):
    NOT_FOUND = "NotFound"
    QUOTA_EXCEEDED = "QuotaExceeded"
    TRANSIENT = "Transient"
    PERMANENT = "Permanent"


class InstanceCreated(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "instance"
    command_id: str
    provider: str
    provider_id: str


class InstanceObserved(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "instance"
    command_id: str
    provider: str
    provider_id: str
    state: InstanceState
    ip: str = ""
    url: str = ""
    instance_uid: str = ""
    created_at: str = ""


class InstanceGone(Event, frozen=True, kw_only=True):
    """The provider answered NotFound for the instance: deleted, vanished, or never made."""

    category: ClassVar[str] = "instance"
    command_id: str
    provider: str
    provider_id: str


class ProviderFailed(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "instance"
    command_id: str
    provider: str
    operation: str
    error_class: ErrorClass
    message: str
    provider_id: str = ""


# --------------------------------------------------------------------------------------------
# proxy.<uid>.health — transitions only; full-rate figures go to metrics


class HealthChanged(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "health"
    healthy: bool
    reason: str = ""
    message: str = ""
    latency_ms: float = 0.0
    provider_id: str = ""


# --------------------------------------------------------------------------------------------
# proxy.<uid>.status — phase and condition changes the reconciler decided


class Phase(StrEnum):
    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    READY = "Ready"
    REPLACING = "Replacing"
    DELETING = "Deleting"
    FAILED = "Failed"


class Condition(msgspec.Struct, frozen=True, kw_only=True):
    type: str
    status: str
    reason: str = ""
    message: str = ""


class PhaseChanged(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "status"
    phase: Phase
    reason: str = ""
    message: str = ""
    ip: str = ""
    url: str = ""
    provider_id: str = ""
    observed_generation: int = 0
    conditions: tuple[Condition, ...] = ()


ProxyEvent = (
    ProxyDeclared
    | ProxySpecChanged
    | ProxyDeletionRequested
    | ProxyRemoved
    | CreateInstance
    | ObserveInstance
    | DeleteInstance
    | InstanceCreated
    | InstanceObserved
    | InstanceGone
    | ProviderFailed
    | HealthChanged
    | PhaseChanged
    | RotationRequested
    | ReplacementStarted
    | ReplacementPromoted
    | RotationEnded
    | EgressObserved
    | EgressChanged
)
