"""Event schemas: every fact and decision the system records, as one union (``AnyEvent``) and the
registry derived from it (``EVENT_TYPES``). The events of each aggregate live in a module of their
own (``events.proxy``, ``events.lease``, ``events.pool``, ``events.gc``, ``events.rotation``,
``events.egress``, ``events.traffic``, ``events.meter``); every type is named from here too, and
the dead-letter record is here.

Events are frozen msgspec Structs in one tagged union, so a single Decoder turns any payload into
the right type and services dispatch with ``match``. The tag (the class name) is also sent in the
``Egress-Event-Type`` header, which lets a consumer skip a type it does not know without decoding.

Schema evolution: a field added later must have a default, so events written before it still
decode; decoders ignore fields they do not know, so old readers survive new writers.

Each event names the *category* of its aggregate subject (``proxy.<uid>.<category>``); the store
derives the subject from it, so a writer cannot put an event on the wrong subject.
"""

from __future__ import annotations

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
from events.meter import UpstreamMetered
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
from events.proxy import (
    Condition,
    CreateInstance,
    DeleteInstance,
    ErrorClass,
    HealthChanged,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    ObserveInstance,
    Phase,
    PhaseChanged,
    ProviderFailed,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyEvent,
    ProxyRemoved,
    ProxySpecChanged,
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
from events.traffic import TrafficRecorded, TrafficRow

# The proxy, lease, gc, pool and rotation events and the spec live in modules of their own;
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
    "MeterEvent",
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
    "TrafficEvent",
    "TrafficRecorded",
    "TrafficRow",
    "UpstreamMetered",
]

SCHEMA_VERSION = 1


# Proxy events (proxy.<uid>.*) are in events.proxy, lease events (lease.<proxy-uid>) in
# events.lease, garbage collection (gc.<provider>) in events.gc, and make-before-break rotation
# (docs/decisions/0085-a-fresh-ip-without-downtime.md) in events.rotation; all are part of the
# union below.


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
TrafficEvent = TrafficRecorded
MeterEvent = UpstreamMetered
AnyEvent = (
    ProxyEvent
    | LeaseEvent
    | GcEvent
    | PoolEvent
    | DemandEvent
    | TrafficEvent
    | MeterEvent
    | DeadLettered
)

# Derived from the union, never listed beside it: an event added to the union is known to every
# reader the day it is written (tests/unit/test_event_registry.py holds the rest to it).
EVENT_TYPES: dict[str, type[Event]] = {cls.__name__: cls for cls in get_args(AnyEvent)}
