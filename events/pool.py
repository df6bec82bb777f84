"""The events of proxy pools (docs/architecture.md, "Pools"): what a pool asks for, and what its
controller decided about its members, on ``pool.<uid>.<category>`` in the ``POOL`` stream.

A pool owns Proxies (its *members*), declared on their own aggregates exactly as a person would
declare them; the pool's aggregate records which members it planned and retired and why, so
"why did it grow at 14:02" is answered by replay, and two controller replicas meet at the pool's
optimistic concurrency instead of both adding a member.

Part of the one tagged union ``events.schemas`` defines (and re-exports these from); the rules
there (new fields take defaults) hold here.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from events.base import Event
from events.spec import ProxySpec

MAX_REPLICAS = 10_000
"""The most members a pool may ask for: a bound on the work of one decision and one event."""
MAX_SPREAD = 16
MAX_WEIGHT = 1000
MIN_AGE_SECONDS = 10.0
MAX_AGE_SECONDS = 365 * 24 * 3600.0
MAX_SURGE = 100
MAX_BLOCKS = 1000
MAX_AUTOSCALE_WAIT_SECONDS = 7 * 24 * 3600.0
"""The longest ``scaleUpAfter`` or ``scaleDownAfter``: a week."""
MAX_MEMBERS_PER_DECISION = 100
"""A decision adds, retires or recycles at most this many members, so one event stays small and
a pool of 10,000 grows in steps the log and the reconciler can follow."""


class SpreadEntry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    provider: str
    weight: int = 1


class Autoscale(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """The pool sizes itself between ``min`` and ``max`` by its load (docs/pools.md,
    "Autoscale"): unserved lease requests (waiting, or refused) or more leased than
    ``target_leased`` of its members for ``scale_up_after_seconds`` add members; fewer for
    ``scale_down_after_seconds`` remove unleased ones."""

    min: int = 1
    max: int = 10
    target_leased: float = 0.8
    scale_up_after_seconds: float = 30.0
    scale_down_after_seconds: float = 600.0


class PoolSpec(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """What a pool asks for, with durations in seconds (the resource's ``6h`` is parsed before
    anything is appended, ``events.poolresource``)."""

    replicas: int = 0
    template: ProxySpec = msgspec.field(default_factory=ProxySpec)
    spread: tuple[SpreadEntry, ...] = ()
    max_age_seconds: float = 0.0
    """0: members are never replaced for their age."""
    recycle_on_blocks: int = 0
    """0: blocks never replace a member."""
    max_surge: int = 1
    autoscale: Autoscale | None = None
    """None: ``replicas`` is the size, changed by people (or an outside autoscaler)."""


class PoolMember(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A member as the pool planned it; its Proxy is ``name`` in the pool's namespace."""

    ordinal: int
    name: str
    uid: str
    provider: str


class PoolFigures(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the controller saw when it decided: the answer to "why" kept beside the decision."""

    desired: int = 0
    members: int = 0
    ready: int = 0
    healthy: int = 0
    leased: int = 0
    rotating: int = 0
    waiting: int = 0
    """Lease requests naming the pool waiting for a member, on every discovery replica."""
    refused: dict[str, int] = msgspec.field(default_factory=dict)
    """Lease requests naming the pool answered 503 lately, by why (``busy``, ``scaling``)."""
    unserved: int = 0
    """Distinct holders among those waiting or refused: the members the load lacks."""


# --------------------------------------------------------------------------------------------
# pool.<uid>.declared: what people asked for (the CLI, the Kubernetes watcher, a scale)


class PoolDeclared(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "declared"
    uid: str
    namespace: str
    name: str
    spec: PoolSpec
    generation: int = 1
    source: str = "cli"


class PoolSpecChanged(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "declared"
    uid: str
    spec: PoolSpec
    generation: int = 1


class PoolScaled(Event, frozen=True, kw_only=True):
    """``scale pool NAME --replicas N`` (or the scale subresource): only the count changes, so
    the template's members are not rolled."""

    category: ClassVar[str] = "declared"
    uid: str
    replicas: int


class PoolDeletionRequested(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "declared"
    uid: str


class PoolRemoved(Event, frozen=True, kw_only=True):
    """The last event of a pool: every member it planned is removed."""

    category: ClassVar[str] = "declared"
    uid: str


# --------------------------------------------------------------------------------------------
# pool.<uid>.decision: what the pool controller decided, with what it saw


class PoolDecided(Event, frozen=True, kw_only=True):
    """One decision of the pool controller. ``added`` members are then declared, ``retired`` ones
    deleted and ``recycled`` ones rotated (a fresh instance, make-before-break), each on its own
    Proxy aggregate; a crash after this event is finished by the next evaluation, which sees a
    planned member without its Proxy (or a retired one still there) and declares (deletes) it."""

    category: ClassVar[str] = "decision"
    uid: str
    reason: str
    """Why, in a line: ``ScaleUp``, ``ScaleDown``, ``MaxAge``, ``Blocked``, ``Template``,
    ``Spread``, ``Failed``, ``Deleting``."""
    message: str = ""
    added: tuple[PoolMember, ...] = ()
    retired: tuple[str, ...] = ()
    """Member uids the pool no longer wants."""
    recycled: tuple[str, ...] = ()
    """Member uids given a fresh instance (``RotationRequested`` on each)."""
    rolled: tuple[str, ...] = ()
    """Member uids re-declared with the pool's current template."""
    figures: PoolFigures = msgspec.field(default_factory=PoolFigures)
    generation: int = 0
    """The pool generation decided on."""
    scaled_to: int | None = None
    """An autoscaled pool's new size (reason ``Autoscale``)."""


class PoolPressure(Event, frozen=True, kw_only=True):
    """An autoscaled pool's load changed direction: ``up`` (it wants more members), ``down``
    (fewer) or ``steady``. Recorded so that every controller replica counts ``scaleUpAfter`` and
    ``scaleDownAfter`` from the same instant, and a replay says when the load turned."""

    category: ClassVar[str] = "decision"
    uid: str
    pressure: str
    wanted: int = 0
    """The size the load asked for when it turned."""
    figures: PoolFigures = msgspec.field(default_factory=PoolFigures)


# --------------------------------------------------------------------------------------------
# demand.<pool uid>: what discovery replicas could not serve (the DEMAND stream)


class PoolDemand(Event, frozen=True, kw_only=True):
    """One discovery replica's unserved lease requests naming a pool, over ``interval_seconds``
    (sent while there are any, and once more when they end). Kept on a stream of its own, with
    an age limit, so that the pool's aggregate stays small and its decisions uncontested."""

    category: ClassVar[str] = "demand"
    uid: str
    """The pool's."""
    replica: str
    waiting: int = 0
    refused: dict[str, int] = msgspec.field(default_factory=dict)
    unserved: int = 0
    interval_seconds: float = 0.0
