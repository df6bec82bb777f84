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

from datetime import datetime
from enum import StrEnum
from typing import ClassVar

import msgspec

SCHEMA_VERSION = 1


class Event(msgspec.Struct, frozen=True, tag=True, kw_only=True):
    """Base of every event; ``category`` picks the last subject token."""

    category: ClassVar[str] = ""


# --------------------------------------------------------------------------------------------
# The Proxy resource (shared by the CLI and the Kubernetes watcher)


class ProxyMode(StrEnum):
    MANAGED = "Managed"
    EXTERNAL = "External"


class Placement(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    region: str = ""
    zone: str = ""
    machine_type: str = ""
    image: str = ""


class SecretRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    key: str = "userdata"


class CloudInit(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    inline: str = ""
    secret_ref: SecretRef | None = None


class External(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    url: str = ""


class HealthCheck(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    url: str = ""
    interval_seconds: float = 1.0
    timeout_seconds: float = 5.0
    failure_threshold: int = 3
    success_threshold: int = 1


class ProxySpec(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    mode: ProxyMode = ProxyMode.MANAGED
    provider: str = ""
    placement: Placement = msgspec.field(default_factory=Placement)
    attributes: dict[str, str] = msgspec.field(default_factory=dict)
    cloud_init: CloudInit | None = None
    external: External | None = None
    health_check: HealthCheck = msgspec.field(default_factory=HealthCheck)


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


# --------------------------------------------------------------------------------------------
# lease.<proxy-uid>

MAX_LEASE_SECONDS = 7 * 24 * 3600.0
"""The longest lease: the LEASE stream keeps events 7 days, and a lease that outlived its own
``LeaseAcquired`` would vanish from a rebuilt view while its holder still used the proxy."""
MAX_COOLDOWN_SECONDS = 24 * 3600.0
"""The longest rest after a lease; a longer one takes a proxy out of service, which is not what
a cooldown is for (delete the proxy instead)."""
MAX_TARGET_LENGTH = 253
"""A target is a host name (``projections.outcomes.target_key``): at most 253 characters."""
MAX_BLOCK_BACKOFF_SECONDS = 24 * 3600.0
"""The longest back-off a ``blocked`` report starts for a (proxy, target) pair, however often the
target blocked it: a site's block list changes, and a day is long enough to learn it has not."""


class LeaseAcquired(Event, frozen=True, kw_only=True):
    """A claim on the proxy; the lease fold decides whether it holds (it does not while another
    lease is active or the proxy cools down, judged by this event's JetStream timestamp)."""

    category: ClassVar[str] = "lease"
    lease_id: str
    proxy_uid: str
    holder: str = ""
    ttl_seconds: float
    selector: dict[str, str] = msgspec.field(default_factory=dict)
    fencing_token: int = 0
    """The writer's information only (the previous token + 1, as its view saw it). The token the
    lease carries is the fold's: this event's stream sequence, never less than the previous
    token + 1 (docs/decisions.md, D80)."""
    cooldown_seconds: float = 0.0
    """The cooldown that follows if this lease ends by expiry rather than release."""
    requested_ttl_seconds: float = 0.0
    """What the client asked for (0: nothing, the default applied); more than ``ttl_seconds``
    when the server's maximum lease TTL clamped it."""
    deadline: datetime | msgspec.UnsetType = msgspec.UNSET
    """When the writer stopped waiting for the log: its idea of the server's time plus its append
    timeout and a margin. A claim stamped later was answered as failed, so the fold ignores it
    (docs/api.md, "When NATS is unreachable"). Unset (left out of the payload): no deadline."""
    target: str = ""
    """The host the holder means to reach (``projections.outcomes.target_key`` of what it
    sent); the claim does not hold while that host has the proxy in back-off. Empty: any."""


class LeaseReleased(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "lease"
    lease_id: str
    proxy_uid: str
    cooldown_seconds: float = 0.0
    deadline: datetime | msgspec.UnsetType = msgspec.UNSET
    """As on ``LeaseAcquired``: a release stamped after it changes nothing."""
    withdrawn: bool = False
    """Written by the system, not the holder: the claim's requester had been told it failed
    (its acknowledgement was lost in an outage), so nobody holds the lease."""


class LeaseReported(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "lease"
    lease_id: str
    proxy_uid: str
    outcome: str
    """``success``, ``blocked`` or ``failed`` (the API accepts nothing else)."""
    detail: str = ""
    target: str = ""
    """What the holder was reaching through the proxy (a host or URL), when it said."""
    deadline: datetime | msgspec.UnsetType = msgspec.UNSET
    """As on ``LeaseAcquired``: a report stamped after it is not recorded in the view."""
    backoff_seconds: float = 0.0
    """The writer's ``--block-backoff``: how long a first ``blocked`` report for (proxy, target)
    keeps the proxy from that target; each further one doubles it, up to
    ``MAX_BLOCK_BACKOFF_SECONDS``. Carried in the event so that every replica, and a rebuild,
    computes the same back-off. 0 (and every report written before back-offs): none."""


class LeaseExpired(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "lease"
    lease_id: str
    proxy_uid: str


class LeaseRenewed(Event, frozen=True, kw_only=True):
    """The holder asked for more time: the lease now ends ``ttl_seconds`` after this event's
    JetStream timestamp (the log's time, like every lease time), never later than
    ``MAX_LEASE_SECONDS`` after it was acquired. The fold counts it only while the lease is
    current and not past its end at that timestamp; the fencing token stays (D78)."""

    category: ClassVar[str] = "lease"
    lease_id: str
    proxy_uid: str
    ttl_seconds: float
    requested_ttl_seconds: float = 0.0
    """What the client asked for; more than ``ttl_seconds`` when the server clamped it."""
    deadline: datetime | msgspec.UnsetType = msgspec.UNSET
    """As on ``LeaseAcquired``: a renewal stamped after it changes nothing."""


# --------------------------------------------------------------------------------------------
# gc.<provider>


class OrphanFound(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "gc"
    provider: str
    provider_id: str
    owner_uid: str
    created_at: str = ""
    sweep_id: str = ""
    """The sweep that found it: the same id on its ``OrphanDeleted`` and ``SweepCompleted``."""
    kind: str = "instance"
    """``instance``, or what kind of leftover a provider reported (e.g. ``volume``): something
    it made for an instance that outlived it."""


class OrphanDeleted(Event, frozen=True, kw_only=True):
    """The result of deleting one orphan; ``ok=False`` records a failed attempt (the next sweep
    tries again), so the log shows every attempt, not only the successes."""

    category: ClassVar[str] = "gc"
    provider: str
    provider_id: str
    owner_uid: str
    sweep_id: str = ""
    ok: bool = True
    error_class: str = ""
    error: str = ""
    kind: str = "instance"
    """As on ``OrphanFound``."""


class SweepCompleted(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "gc"
    provider: str
    listed: int
    orphans: int
    deleted: int
    skipped: bool = False
    reason: str = ""
    sweep_id: str = ""
    failed: int = 0
    """Orphans whose delete failed this round (not counted in ``deleted``)."""
    young: int = 0
    """Instances of no live proxy spared because they are younger than the grace."""
    leftovers: int = 0
    """Orphaned leftovers found (not counted in ``orphans``); the fields below are theirs."""
    leftovers_deleted: int = 0
    leftovers_failed: int = 0
    leftovers_in_use: int = 0
    """Kept at delete time because their instance came back (a create resumed)."""
    leftovers_reason: str = ""
    """Why the leftovers were skipped this round (their listing failed); "" when they were not."""


# --------------------------------------------------------------------------------------------
# Make-before-break: a fresh instance for a proxy without downtime (docs/decisions.md, D85).
# proxy.<uid>.rotate holds the requests: a subject of its own, so that discovery, which writes
# them, may write nothing the reconciler takes as a declaration.


class RotationRequested(Event, frozen=True, kw_only=True):
    """Someone asked for a fresh instance (a fresh IP) of the proxy, without downtime: a
    replacement is made first, the proxy and its lease switch to it once it is Ready and probed
    healthy, and only then is the old instance deleted. A request while a rotation is under way
    changes nothing (the API answers with the rotation under way)."""

    category: ClassVar[str] = "rotate"
    uid: str
    rotation_id: str
    lease_id: str = ""
    """The lease whose holder asked (``POST /v1/leases/{id}/rotate``); "" for anyone else."""


class ReplacementStarted(Event, frozen=True, kw_only=True):
    """The reconciler begins a make-before-break replacement: the ``CreateInstance`` with
    ``command_id`` makes the replacement, and its answers are about it, not about the proxy's
    current instance."""

    category: ClassVar[str] = "status"
    rotation_id: str
    command_id: str
    reason: str = "Requested"
    """``Requested`` (a ``RotationRequested``) or ``SpecChanged`` (a leased proxy's new spec)."""
    lease_id: str = ""


class ReplacementPromoted(Event, frozen=True, kw_only=True):
    """The replacement, Ready and healthy, is now the proxy's instance; the one it replaces
    (``retired_provider_id``) is deleted after the reconciler's drain time, once the proxy's
    lease has switched (``LeaseSwitched``)."""

    category: ClassVar[str] = "status"
    rotation_id: str
    provider_id: str
    retired_provider_id: str = ""
    ip: str = ""
    url: str = ""


class RotationEnded(Event, frozen=True, kw_only=True):
    """A rotation given up before its switch: its replacement failed, stopped, vanished or was
    judged unhealthy (``failed``), or the proxy's spec changed or it is being deleted
    (``cancelled``). The proxy keeps its instance; the replacement, if any, is deleted."""

    category: ClassVar[str] = "status"
    rotation_id: str
    outcome: str = "failed"
    message: str = ""


class LeaseSwitched(Event, frozen=True, kw_only=True):
    """The lease now goes through the proxy's new instance (a rotation's replacement). The
    lease's fencing token becomes this event's stream sequence (at least the previous token
    + 1), as a grant's does (D80): whatever downstream fences on it learns the lease moved."""

    category: ClassVar[str] = "lease"
    lease_id: str
    proxy_uid: str
    rotation_id: str
    provider_id: str
    ip: str = ""


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
)
LeaseEvent = (
    LeaseAcquired | LeaseReleased | LeaseReported | LeaseExpired | LeaseRenewed | LeaseSwitched
)
GcEvent = OrphanFound | OrphanDeleted | SweepCompleted
AnyEvent = ProxyEvent | LeaseEvent | GcEvent | DeadLettered

EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        ProxyDeclared,
        ProxySpecChanged,
        ProxyDeletionRequested,
        ProxyRemoved,
        CreateInstance,
        ObserveInstance,
        DeleteInstance,
        InstanceCreated,
        InstanceObserved,
        InstanceGone,
        ProviderFailed,
        HealthChanged,
        PhaseChanged,
        LeaseAcquired,
        LeaseReleased,
        LeaseReported,
        LeaseExpired,
        LeaseRenewed,
        OrphanFound,
        OrphanDeleted,
        SweepCompleted,
        DeadLettered,
        RotationRequested,
        ReplacementStarted,
        ReplacementPromoted,
        RotationEnded,
        LeaseSwitched,
    )
}
