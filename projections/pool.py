"""The pool view: a fold of ``pool.<uid>.*`` (docs/architecture.md, "Pools").

What the pool asks for (its spec, its replicas after a scale), which members its controller
planned and which it retired, and its last decision with the figures behind it. Pure: every time
is the JetStream timestamp of the event, so a rebuild equals the live view.

The log is trusted for nothing: an event before the pool's declaration is ``Undeclared`` (the
tolerant readers skip and count it), and a decision naming a member that could never be a Proxy
(a name that is no DNS label, a uid that is no subject token, an ordinal out of range) has that
member ignored and counted in ``unusable``. So has a spec the decider could not act on
(``usable_spec``): a change to one is left, a declaration of one declares a pool of nothing, and
a scale of a pool with no usable spec is left too, so the decider only ever sees a spec the
resource's validation would have let through.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import msgspec

from events.pool import (
    MAX_AGE_SECONDS,
    MAX_AUTOSCALE_WAIT_SECONDS,
    MAX_BLOCKS,
    MAX_REPLICAS,
    MAX_SPREAD,
    MAX_SURGE,
    MAX_WEIGHT,
    MIN_AGE_SECONDS,
    PoolDecided,
    PoolDeclared,
    PoolDeletionRequested,
    PoolMember,
    PoolPressure,
    PoolRemoved,
    PoolScaled,
    PoolSpec,
    PoolSpecChanged,
)
from events.spec import ProxyMode
from events.store import Recorded
from events.subjects import proxy_uid_of

PRESSURES = ("steady", "up", "down")
"""An autoscaled pool's load: as it should be, wanting more members, wanting fewer."""
FAILURE_MEMORY = timedelta(minutes=10)
"""How long a provider that failed a member is avoided when members are placed."""
MAX_ORDINAL = 10**12
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}\Z")
_PROVIDER = re.compile(r"^[A-Za-z0-9_-]{1,63}\Z")


class Undeclared(ValueError):
    """An event about a pool no ``PoolDeclared`` has introduced (skipped by tolerant readers)."""


class Planned(msgspec.Struct, frozen=True, kw_only=True):
    """A member as the pool keeps it."""

    member: PoolMember
    planned_at: datetime
    generation: int
    """The pool generation whose template the member was last declared with."""
    retired_at: datetime | None = None


class PoolView(msgspec.Struct, frozen=True, kw_only=True):
    uid: str
    namespace: str = ""
    name: str = ""
    spec: PoolSpec = msgspec.field(default_factory=PoolSpec)
    generation: int = 0
    replicas: int = 0
    """What the pool asks for now: the spec's, or the last scale's since the spec changed."""
    source: str = ""
    deleting: bool = False
    removed: bool = False
    members: dict[str, Planned] = msgspec.field(default_factory=dict)
    """uid -> member, retired ones included until the pool is removed; never changed in place."""
    next_ordinal: int = 0
    failures: dict[str, datetime] = msgspec.field(default_factory=dict)
    """provider -> when a member on it was last retired as Failed."""
    last_decision: PoolDecided | None = None
    decided_at: datetime | None = None
    decisions: int = 0
    pressure: str = "steady"
    """An autoscaled pool's load as last recorded (``PRESSURES``)."""
    pressure_since: datetime | None = None
    """Since when; a scale by the autoscaler starts the count again."""
    unusable: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None
    last_seq: int = 0

    def active(self) -> list[Planned]:
        """The members it wants, by ordinal."""
        kept = (p for p in self.members.values() if p.retired_at is None)
        return sorted(kept, key=lambda p: p.member.ordinal)

    def retired(self) -> list[Planned]:
        return sorted(
            (p for p in self.members.values() if p.retired_at is not None),
            key=lambda p: p.member.ordinal,
        )

    def failing(self, now: datetime) -> frozenset[str]:
        """Providers avoided when placing members: one failed a member lately."""
        return frozenset(p for p, at in self.failures.items() if now - at < FAILURE_MEMORY)


def usable_member(member: PoolMember) -> bool:
    return (
        bool(_DNS_LABEL.match(member.name))
        and bool(_TOKEN.match(member.uid))
        and bool(_TOKEN.match(member.provider))
        and 0 <= member.ordinal < MAX_ORDINAL
    )


def named_usably(view: PoolView) -> bool:
    """Whether members can be named after the pool: its namespace a DNS label, its name one that
    leaves room for a member's suffix. A hand-written ``PoolDeclared`` may hold anything."""
    return bool(_DNS_LABEL.match(view.namespace)) and bool(_DNS_LABEL.match(f"{view.name}-bbbbb"))


def usable_spec(spec: PoolSpec) -> bool:
    """Within the bounds ``events.poolresource`` holds a ProxyPool to, and with a provider to
    place members on: a weight of 0 would divide by zero, a negative ``maxAge`` or
    ``recycleOnBlocks`` recycle every member at every evaluation, and a member with no provider
    is refused by this fold, planned again at every evaluation."""
    spread = spec.spread
    providers = [e.provider for e in spread] or [spec.template.provider]
    age = spec.max_age_seconds
    return (
        0 <= spec.replicas <= MAX_REPLICAS
        and 1 <= spec.max_surge <= MAX_SURGE
        and 0 <= spec.recycle_on_blocks <= MAX_BLOCKS
        and (age == 0 or MIN_AGE_SECONDS <= age <= MAX_AGE_SECONDS)  # NaN is neither
        and len(spread) <= MAX_SPREAD
        and all(1 <= e.weight <= MAX_WEIGHT for e in spread)
        and all(_PROVIDER.match(p) for p in providers)
        and len(set(providers)) == len(providers)
        and spec.template.mode is ProxyMode.MANAGED
        and (spec.autoscale is None or usable_autoscale(spec))
    )


def usable_autoscale(spec: PoolSpec) -> bool:
    """Bounds the decider can act on: ``min <= max`` within the replicas' bounds, a target
    leased share in (0, 1], waits within a week (NaN is none of these)."""
    a = spec.autoscale
    if a is None:
        return False
    waits = (a.scale_up_after_seconds, a.scale_down_after_seconds)
    return (
        0 <= a.min <= a.max <= MAX_REPLICAS
        and a.max >= 1
        and 0 < a.target_leased <= 1
        and all(0 <= w <= MAX_AUTOSCALE_WAIT_SECONDS for w in waits)
    )


def _decided(view: PoolView, event: PoolDecided, at: datetime) -> PoolView:
    members = dict(view.members)
    unusable = view.unusable
    next_ordinal = view.next_ordinal
    for member in event.added:
        if not usable_member(member) or member.uid in members:
            unusable += 1
            continue
        members[member.uid] = Planned(member=member, planned_at=at, generation=view.generation)
        next_ordinal = max(next_ordinal, member.ordinal + 1)
    failures = dict(view.failures)
    for uid in event.retired:
        planned = members.get(uid)
        if planned is None or planned.retired_at is not None:
            continue
        members[uid] = msgspec.structs.replace(planned, retired_at=at)
        if event.reason == "Failed":
            failures[planned.member.provider] = at
    for uid in event.rolled:
        planned = members.get(uid)
        if planned is not None and planned.retired_at is None:
            members[uid] = msgspec.structs.replace(planned, generation=view.generation)
    replicas, pressure, since = view.replicas, view.pressure, view.pressure_since
    if event.scaled_to is not None:
        if view.spec.autoscale is not None and 0 <= event.scaled_to <= MAX_REPLICAS:
            # The count starts again: the members just asked for get their time to serve.
            replicas, pressure, since = event.scaled_to, "steady", at
        else:
            unusable += 1
    return msgspec.structs.replace(
        view,
        members=members,
        next_ordinal=next_ordinal,
        failures=failures,
        last_decision=event,
        decided_at=at,
        decisions=view.decisions + 1,
        unusable=unusable,
        replicas=replicas,
        pressure=pressure,
        pressure_since=since,
    )


def apply(view: PoolView | None, recorded: Recorded) -> PoolView:
    event = recorded.event
    at = recorded.timestamp
    if isinstance(event, PoolDeclared):
        if event.uid != key(recorded.subject):
            # Its uid names the pool everywhere (its subjects, its members' names, its
            # demand): one that is not its own subject's token could be no subject at all.
            raise Undeclared(f"PoolDeclared of {event.uid!r} on {recorded.subject}")
        if view is not None and not view.removed:
            return _stamp(view, recorded)  # a second declaration changes nothing
        usable = usable_spec(event.spec)
        spec = event.spec if usable else PoolSpec()
        fresh = PoolView(
            uid=event.uid,
            namespace=event.namespace,
            name=event.name,
            spec=spec,
            generation=event.generation,
            replicas=spec.replicas,
            source=event.source,
            unusable=0 if usable else 1,
            created_at=at,
        )
        return _stamp(fresh, recorded)
    if view is None:
        raise Undeclared(f"{type(event).__name__} on {recorded.subject} before its PoolDeclared")
    match event:
        case PoolSpecChanged(spec=spec, generation=generation):
            if usable_spec(spec):
                view = msgspec.structs.replace(
                    view, spec=spec, generation=generation, replicas=spec.replicas
                )
            else:
                view = msgspec.structs.replace(view, unusable=view.unusable + 1)
        case PoolScaled(replicas=replicas):
            if 0 <= replicas <= MAX_REPLICAS and usable_spec(view.spec):
                view = msgspec.structs.replace(view, replicas=replicas)
            else:
                view = msgspec.structs.replace(view, unusable=view.unusable + 1)
        case PoolDeletionRequested():
            view = msgspec.structs.replace(view, deleting=True)
        case PoolRemoved():
            view = msgspec.structs.replace(view, removed=True, deleting=False, members={})
        case PoolDecided():
            view = _decided(view, event, at)
        case PoolPressure(pressure=pressure):
            if pressure in PRESSURES and view.spec.autoscale is not None:
                if pressure != view.pressure:
                    view = msgspec.structs.replace(view, pressure=pressure, pressure_since=at)
            else:
                view = msgspec.structs.replace(view, unusable=view.unusable + 1)
        case _:
            return view
    return _stamp(view, recorded)


def _stamp(view: PoolView, recorded: Recorded) -> PoolView:
    return msgspec.structs.replace(view, updated_at=recorded.timestamp, last_seq=recorded.seq)


def fold(events: list[Recorded]) -> PoolView | None:
    """The view after ``events`` (a pool's history); events before the pool's first declaration
    are skipped, as the tolerant readers skip them (``Undeclared``)."""
    view: PoolView | None = None
    for recorded in events:
        if view is None and not isinstance(recorded.event, PoolDeclared):
            continue
        view = apply(view, recorded)
    return view


def key(subject: str) -> str:
    return proxy_uid_of(subject)
