"""The pools pages' content: pure functions of the pool, proxy and lease views and an instant.

A pool's figures and each member's state are judged as its controller judges them
(``projections.pool_members``) and summed as the API sums them (``services.discovery.pure.pools``),
so "3 of 3 Ready" on the page is what ``GET /v1/pools`` answers and what the next decision sees.
The live pages pass the replica's views and its ``now``; a time travel passes views folded up to
``at`` and ``at`` itself (docs/console.md). Everything here is text from the log, shown as it is
stored; the templates escape it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from events.durations import format_duration
from events.pool import (
    PoolDecided,
    PoolDeclared,
    PoolDeletionRequested,
    PoolFigures,
    PoolRemoved,
    PoolScaled,
    PoolSpec,
    PoolSpecChanged,
)
from events.schemas import Condition
from events.store import Recorded, Unreadable
from projections.lease import LeaseView
from projections.pool import Planned, PoolView
from projections.pool_members import MemberState, available_members, member_state, member_states
from projections.proxy import ProxyView
from services.discovery.console.pure.fleet import health_of
from services.discovery.console.pure.timeline import MAX_LINES, MAX_SUMMARY
from services.discovery.pure.pools import ProviderCount, conditions, summarize

NOT_DECLARED = "not declared"
RETIRING = "retiring"
DELETING = "deleting"
ROTATING = "rotating"
FAILED = "failed"
READY = "Ready"
RANKS = {READY: 0, ROTATING: 1, NOT_DECLARED: 3, FAILED: 4, DELETING: 5, RETIRING: 6}
"""Members are listed by state in this order, any other phase (Pending, Provisioning...) at 2:
what is serving first, then what is on its way, then what is going."""
OTHER_PHASE = 2


def pool_ref(pool: PoolView) -> str:
    return f"{pool.namespace}/{pool.name}"


def listed(pools: Iterable[PoolView]) -> list[PoolView]:
    """Every pool declared and not removed, by namespace and name."""
    kept = [p for p in pools if p.name and not p.removed]
    return sorted(kept, key=lambda p: (p.namespace, p.name, p.uid))


def membership(pools: Iterable[PoolView]) -> dict[str, str]:
    """uid -> ``namespace/name`` of the pool that planned it (retired members still declared
    included): the fleet page's pool column and filter. A uid two pools claim (only a
    hand-written log can) goes to the one listed last, whichever request asks."""
    out: dict[str, str] = {}
    for pool in listed(pools):
        for uid in pool.members:
            out[uid] = pool_ref(pool)
    return out


@dataclass(frozen=True, slots=True)
class PoolLine:
    """A pool as the pools page lists it, at one instant."""

    pool: PoolView
    figures: PoolFigures
    available: int
    providers: dict[str, ProviderCount]
    conditions: tuple[Condition, ...]
    scaling: bool

    @property
    def ref(self) -> str:
        return pool_ref(self.pool)


def pool_line(
    pool: PoolView,
    proxies: Mapping[str, ProxyView],
    leases: Mapping[str, LeaseView],
    now: datetime,
) -> PoolLine:
    states = member_states(pool.active(), proxies, leases, now)
    available = available_members(pool, proxies, leases, now)
    got = summarize(pool, states, available)
    return PoolLine(
        pool=pool,
        figures=got.figures,
        available=got.available,
        providers=got.providers,
        conditions=tuple(conditions(pool, got)),
        scaling=got.scaling,
    )


def pool_lines(
    pools: Iterable[PoolView],
    proxies: Mapping[str, ProxyView],
    leases: Mapping[str, LeaseView],
    now: datetime,
) -> list[PoolLine]:
    return [pool_line(p, proxies, leases, now) for p in listed(pools)]


@dataclass(frozen=True, slots=True)
class MemberRow:
    """A member as the pool page shows it."""

    uid: str
    name: str
    ordinal: int
    provider: str
    state: str
    phase: str
    health: str
    leased: bool
    holder: str
    since: datetime | None
    """When its current instance took over: the member's age is counted from it."""
    retired: bool

    @property
    def declared(self) -> bool:
        """Whether its Proxy exists, so its page has something to show."""
        return self.state != NOT_DECLARED


def state_of(planned: Planned, state: MemberState) -> str:
    if not state.declared:
        return NOT_DECLARED
    if planned.retired_at is not None:
        return RETIRING
    if state.deleting:
        return DELETING
    if state.failed:
        return FAILED
    if state.rotating:
        return ROTATING
    return READY if state.ready else state.phase or "?"


def _rank(state: str) -> int:
    return RANKS.get(state, OTHER_PHASE)


def members(
    pool: PoolView,
    proxies: Mapping[str, ProxyView],
    leases: Mapping[str, LeaseView],
    now: datetime,
) -> list[MemberRow]:
    """The members it wants, and those it retired whose Proxy is not removed yet, by state
    (``RANKS``) then ordinal."""
    out = []
    for planned in pool.active() + pool.retired():
        uid = planned.member.uid
        proxy, lease = proxies.get(uid), leases.get(uid)
        state = member_state(uid, proxy, lease, now)
        if planned.retired_at is not None and not state.declared:
            continue
        current = lease.current if state.leased and lease is not None else None
        out.append(
            MemberRow(
                uid=uid,
                name=planned.member.name,
                ordinal=planned.member.ordinal,
                provider=planned.member.provider,
                state=state_of(planned, state),
                phase=state.phase,
                health=health_of(proxy) if proxy is not None and state.declared else "",
                leased=state.leased,
                holder=current.holder if current is not None else "",
                since=state.since,
                retired=planned.retired_at is not None,
            )
        )
    out.sort(key=lambda m: (_rank(m.state), m.state, m.ordinal, m.uid))
    return out


def by_state(rows: Iterable[MemberRow]) -> list[tuple[str, int]]:
    """How many members are in each state, in the table's order."""
    seen = Counter(r.state for r in rows)
    return sorted(seen.items(), key=lambda item: (_rank(item[0]), item[0]))


@dataclass(frozen=True, slots=True)
class Spread:
    """A provider's share of a pool: its weight (0: not in the spread any more) and members."""

    provider: str
    weight: int
    members: int
    ready: int


def spread(pool: PoolView, providers: Mapping[str, ProviderCount]) -> list[Spread]:
    """Every provider the spec places members on or that holds members, in the spec's order,
    then the others by name. Without a spread the template's provider holds the weight 1."""
    weights = {e.provider: e.weight for e in pool.spec.spread}
    if not weights and pool.spec.template.provider:
        weights = {pool.spec.template.provider: 1}
    names = list(weights) + sorted(p for p in providers if p not in weights)
    empty = ProviderCount(0, 0)
    return [
        Spread(
            provider=name,
            weight=weights.get(name, 0),
            members=providers.get(name, empty).members,
            ready=providers.get(name, empty).ready,
        )
        for name in names
    ]


def age(since: datetime | None, now: datetime) -> str:
    """``4m``, ``2h``: how long ago ``since`` was, in its largest unit."""
    if since is None:
        return "-"
    seconds = max(int((now - since).total_seconds()), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _attrs(attributes: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(attributes.items())) or "no attributes"


def spec_line(spec: PoolSpec) -> str:
    """A spec in one line, as the timeline and the page's summary say it."""
    where = (
        "spread " + ", ".join(f"{e.provider}:{e.weight}" for e in spec.spread)
        if spec.spread
        else f"on {spec.template.provider or '?'}"
    )
    age_text = format_duration(spec.max_age_seconds) if spec.max_age_seconds else "never"
    blocks = spec.recycle_on_blocks or "off"
    return (
        f"{spec.replicas} replicas {where} ({_attrs(spec.template.attributes)}), maxAge "
        f"{age_text}, recycleOnBlocks {blocks}, maxSurge {spec.max_surge}"
    )


@dataclass(frozen=True, slots=True)
class Entry:
    """One event of a pool's aggregate, as its scaling timeline shows it."""

    seq: int
    time: datetime
    type: str
    reason: str
    """A decision's reason; for the other events, what they did (``Scaled``, ``SpecChanged``)."""
    message: str
    figures: PoolFigures | None
    """What the controller saw when it decided; None for what people asked."""
    changes: str
    """What a decision changed, in counts: ``+2 added, 1 retired``."""


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_SUMMARY else text[: MAX_SUMMARY - 1] + "…"


def _changes(event: PoolDecided) -> str:
    parts = [
        f"{label} {len(uids)}"
        for label, uids in (
            ("added", event.added),
            ("retired", event.retired),
            ("recycled", event.recycled),
            ("rolled", event.rolled),
        )
        if uids
    ]
    return ", ".join(parts) or "nothing"


def entry(recorded: Recorded) -> Entry:
    """The timeline's line for any event stored on a pool's aggregate, an unreadable one too."""
    event = recorded.event
    figures: PoolFigures | None = None
    changes = ""
    match event:
        case PoolDecided() as e:
            kind, reason, message = "PoolDecided", e.reason, e.message
            figures, changes = e.figures, _changes(e)
        case PoolScaled() as e:
            kind, reason, message = "PoolScaled", "Scaled", f"to {e.replicas} replicas"
        case PoolSpecChanged() as e:
            kind, reason = "PoolSpecChanged", "SpecChanged"
            message = f"generation {e.generation}: {spec_line(e.spec)}"
        case PoolDeclared() as e:
            kind, reason = "PoolDeclared", "Declared"
            message = f"{e.namespace}/{e.name} by {e.source}, generation {e.generation}: "
            message += spec_line(e.spec)
        case PoolDeletionRequested():
            kind, reason, message = "PoolDeletionRequested", "Deleting", "deletion requested"
        case PoolRemoved():
            kind, reason, message = "PoolRemoved", "Removed", "every member removed"
        case Unreadable() as e:
            kind, reason = e.type or "?", "Skipped"
            message = f"{e.reason}" + (f": {e.detail}" if e.detail else "")
        case _:  # an event this console does not know yet: its figures, if it has any
            kind, reason, message = type(event).__name__, "", ""
            seen = getattr(event, "figures", None)
            figures = seen if isinstance(seen, PoolFigures) else None
    return Entry(
        seq=recorded.seq,
        time=recorded.timestamp,
        type=kind,
        reason=_cut(reason),
        message=_cut(message),
        figures=figures,
        changes=changes,
    )


def timeline(events: Iterable[Recorded], limit: int = MAX_LINES) -> tuple[list[Entry], int]:
    """The pool's events newest first, at most ``limit``; and how many older ones were left
    out. ``events`` in stream order."""
    ordered = sorted(events, key=lambda r: r.seq, reverse=True)
    return [entry(r) for r in ordered[:limit]], max(len(ordered) - limit, 0)
