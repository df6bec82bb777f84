"""Event schemas: every fact and decision the system records.

Events are frozen msgspec Structs in one tagged union, so a single Decoder turns any payload into
the right type and services dispatch with ``match``. The tag (the class name) is also sent in the
``Egress-Event-Type`` header, which lets a consumer skip a type it does not know without decoding.

Schema evolution: a field added later must have a default, so events written before it still
decode; decoders ignore fields they do not know, so old readers survive new writers.

Each event names the *category* of its aggregate subject (``proxy.<uid>.<category>``); the store
derives the subject from it, so a writer cannot put an event on the wrong subject.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar, get_args

import msgspec

from events.base import Event
from events.egress import EgressChanged, EgressObserved
from events.gc import OrphanDeleted, OrphanFound, SweepCompleted
from events.lease import (
    MAX_BLOCK_BACKOFF_SECONDS,
    MAX_COOLDOWN_SECONDS,
    MAX_LEASE_SECONDS,
    MAX_TARGET_LENGTH,
    LeaseAcquired,
    LeaseExpired,
    LeaseReleased,
    LeaseRenewed,
    LeaseReported,
    LeaseSwitched,
)
from events.pool import (
    PoolDecided,
    PoolDeclared,
    PoolDeletionRequested,
    PoolDemand,
    PoolPressure,
    PoolRemoved,
    PoolScaled,
    PoolSpecChanged,
)
from events.rotation import (
    ReplacementPromoted,
    ReplacementStarted,
    RotationEnded,
    RotationRequested,
)
from events.spec import (
    CloudInit,
    External,
    HealthCheck,
    Placement,
    ProxyMode,
    ProxySpec,
    SecretRef,
)

# The lease, gc, pool and rotation events and the spec live in modules of their own;
# importers name them from here.
__all__ = [
    "MAX_BLOCK_BACKOFF_SECONDS",
    "MAX_COOLDOWN_SECONDS",
    "MAX_LEASE_SECONDS",
    "MAX_TARGET_LENGTH",
    "SCHEMA_VERSION",
    "AnyEvent",
    "CloudInit",
    "Condition",
    "CreateInstance",
    "DeadLettered",
    "DeleteInstance",
    "DemandEvent",
    "EgressChanged",
    "EgressObserved",
    "ErrorClass",
    "Event",
    "External",
    "GcEvent",
    "HealthChanged",
    "HealthCheck",
    "InstanceCreated",
    "InstanceGone",
    "InstanceObserved",
    "InstanceState",
    "LeaseAcquired",
    "LeaseEvent",
    "LeaseExpired",
    "LeaseReleased",
    "LeaseRenewed",
    "LeaseReported",
    "LeaseSwitched",
    "ObserveInstance",
    "OrphanDeleted",
    "OrphanFound",
    "Phase",
    "PhaseChanged",
    "Placement",
    "PoolDecided",
    "PoolDeclared",
    "PoolDeletionRequested",
    "PoolDemand",
    "PoolEvent",
    "PoolPressure",
    "PoolRemoved",
    "PoolScaled",
    "PoolSpecChanged",
    "ProviderFailed",
    "ProxyDeclared",
    "ProxyDeletionRequested",
    "ProxyEvent",
    "ProxyMode",
    "ProxyRemoved",
    "ProxySpec",
    "ProxySpecChanged",
    "ReplacementPromoted",
    "ReplacementStarted",
    "RotationEnded",
    "RotationRequested",
    "SecretRef",
    "SweepCompleted",
]

SCHEMA_VERSION = 1


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


# Lease events (lease.<proxy-uid>) are in events.lease, garbage collection (gc.<provider>) in
# events.gc, and make-before-break rotation (docs/decisions/0085-a-fresh-ip-without-downtime.md) in
# events.rotation; all are part of the union below.


# --------------------------------------------------------------------------------------------
# deadletter.<consumer>


class DeadLettered(Event, frozen=True, kw_only=True):
    """A message a consumer gave up on, kept whole so an operator can inspect and replay it."""

    category: ClassVar[str] = "deadletter"
    consumer: str
    stream: str
    subject: str
    sequence: int
    deliveries: int
    reason: str
    payload: str
    headers: dict[str, str] = msgspec.field(default_factory=dict)


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
LeaseEvent = (
    LeaseAcquired | LeaseReleased | LeaseReported | LeaseExpired | LeaseRenewed | LeaseSwitched
)
GcEvent = OrphanFound | OrphanDeleted | SweepCompleted
PoolEvent = (
    PoolDeclared
    | PoolSpecChanged
    | PoolScaled
    | PoolDeletionRequested
    | PoolRemoved
    | PoolDecided
    | PoolPressure
)
DemandEvent = PoolDemand
AnyEvent = ProxyEvent | LeaseEvent | GcEvent | PoolEvent | DemandEvent | DeadLettered

# Derived from the union, never listed beside it: an event added to the union is known to every
# reader the day it is written (tests/unit/test_event_registry.py holds the rest to it).
EVENT_TYPES: dict[str, type[Event]] = {cls.__name__: cls for cls in get_args(AnyEvent)}
