"""The pool controller's decider: which members to add, retire, recycle and roll
(docs/architecture.md, "Pools"; docs/decisions/0105-a-pool-owns-proxies-and.md).

A function of the pool's view, what the shared views say of its members, and ``now``; level-
triggered, so the same inputs give the same decision on every replica and after every crash.
Nothing here takes a member a crawler holds: a leased member is never retired (it waits for its
lease to end), and one that is aged, blocked or of an old template gets a fresh instance by the
make-before-break rotation, whose lease switch the crawler does not notice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import msgspec

from events.customresource import cli_uid
from events.pool import (
    MAX_MEMBERS_PER_DECISION,
    PoolFigures,
    PoolMember,
    SpreadEntry,
)
from events.poolresource import member_name
from projections.pool import Planned, PoolView, named_usably
from projections.pool_demand import Demand
from projections.pool_members import MemberState, figures
from services.pools.pure import autoscale
from services.pools.pure.members import member_spec
from services.pools.pure.spread import next_provider, over_share, placements, shares

_State = Callable[[Planned], MemberState]

REASONS = (
    "Deleting",
    "Failed",
    "Autoscale",
    "ScaleUp",
    "ScaleDown",
    "Spread",
    "MaxAge",
    "Blocked",
    "Template",
    "Pressure",
)
"""A decision's reason is the first of these it did."""


@dataclass(frozen=True, slots=True)
class Decision:
    reason: str
    message: str
    figures: PoolFigures
    added: tuple[PoolMember, ...] = ()
    retired: tuple[str, ...] = ()
    recycled: tuple[str, ...] = ()
    rolled: tuple[str, ...] = ()
    remove: bool = False
    """Every member is gone and the pool was being deleted: append ``PoolRemoved``."""
    scaled_to: int | None = None
    """An autoscaled pool's new size."""
    pressure: str | None = None
    """An autoscaled pool's load turned (the decision is only that: ``PoolPressure``)."""
    wanted: int = 0


@dataclass(slots=True)
class _Draft:
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    added: list[PoolMember] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    recycled: list[str] = field(default_factory=list)
    rolled: list[str] = field(default_factory=list)
    failed_on: set[str] = field(default_factory=set)
    """Providers of the members this decision retires as failed."""

    def note(self, reason: str, text: str) -> None:
        if reason not in self.reasons:
            self.reasons.append(reason)
        self.notes.append(text)

    def room(self) -> int:
        return MAX_MEMBERS_PER_DECISION - len(self.added) - len(self.retired)


def _member(pool: PoolView, ordinal: int, provider: str) -> PoolMember:
    """A new member: its name from the pool's uid and its ordinal, its uid from its name (as the
    CLI derives a Proxy's), so a decision made twice names the same Proxy."""
    name = member_name(pool.name, pool.uid, ordinal)
    return PoolMember(
        ordinal=ordinal, name=name, uid=cli_uid(pool.namespace, name), provider=provider
    )


def _fresh(pool: PoolView, draft: _Draft, provider: str) -> PoolMember:
    """The next new member, at the first ordinal after the pool's last (and this draft's) whose
    name no member of the pool has: 5 characters hold 27**5 names, so about 4 ordinals in
    10,000 name a member again, and the fold refuses a second member of one uid (the pool would
    stay short, planning the same ordinal at every evaluation)."""
    ordinal = max([pool.next_ordinal, *(m.ordinal + 1 for m in draft.added)])
    taken = {m.uid for m in draft.added}
    while True:
        member = _member(pool, ordinal, provider)
        if member.uid not in pool.members and member.uid not in taken:
            return member
        ordinal += 1


def decide(
    pool: PoolView, states: Mapping[str, MemberState], now: datetime, demand: Demand | None = None
) -> Decision | None:
    """The next decision on ``pool``, or None. ``demand``: the lease requests naming it that
    discovery could not serve lately (``projections.pool_demand``), which only an autoscaled
    pool acts on."""
    if pool.removed or not named_usably(pool):
        return None  # a pool no resource would pass plans nothing (the fold keeps it to be seen)
    demand = demand or Demand()
    seen = msgspec.structs.replace(
        figures(pool, states),
        waiting=demand.waiting,
        refused=dict(demand.refused),
        unserved=demand.unserved,
    )

    def state(planned: Planned) -> MemberState:
        return states.get(planned.member.uid, MemberState(uid=planned.member.uid))

    draft = _Draft()
    scaled_to = None
    if pool.deleting:
        _delete(pool, state, draft)
        if not draft.retired and not any(state(p).declared for p in pool.members.values()):
            return Decision("Deleting", "every member is gone", seen, remove=True)
    else:
        auto = autoscale.step(pool, seen, demand, now)
        if auto.pressure is not None:
            # Only the turn, so that every replica counts from one recorded instant; the rest
            # of the evaluation is done at the next one, a tick later.
            message = f"load turned {auto.pressure}: {auto.wanted} wanted of {pool.replicas}"
            return Decision("Pressure", message, seen, pressure=auto.pressure, wanted=auto.wanted)
        if auto.scaled_to is not None and auto.scaled_to != pool.replicas:
            scaled_to = auto.scaled_to
            draft.note("Autoscale", auto.note)
            pool = msgspec.structs.replace(pool, replicas=scaled_to)
        _failed(pool, state, draft)
        _scale(pool, state, draft, now)
        _recycle(pool, state, draft, now)
        _roll(pool, state, draft)
    if not (
        draft.added or draft.retired or draft.recycled or draft.rolled or scaled_to is not None
    ):
        return None
    reason = min(draft.reasons, key=REASONS.index)
    return Decision(
        reason=reason,
        message="; ".join(draft.notes),
        figures=seen,
        added=tuple(draft.added),
        retired=tuple(draft.retired),
        recycled=tuple(draft.recycled),
        rolled=tuple(draft.rolled),
        scaled_to=scaled_to,
        wanted=scaled_to or 0,
    )


def _delete(pool: PoolView, state: _State, draft: _Draft) -> None:
    """Retire every member, leased ones too: the pool itself is going (their leases end with
    their proxies, as when a person deletes a Proxy)."""
    active = pool.active()[: draft.room()]
    if active:
        draft.retired += [p.member.uid for p in active]
        draft.note("Deleting", f"retired {len(active)} of the pool being deleted")


def _failed(pool: PoolView, state: _State, draft: _Draft) -> None:
    """A member whose provider failed it for good is retired (and replaced elsewhere by the
    scale step, its provider avoided for a while)."""
    failed = [p for p in pool.active() if state(p).failed and not state(p).leased]
    failed = failed[: draft.room()]
    if failed:
        draft.retired += [p.member.uid for p in failed]
        draft.failed_on.update(p.member.provider for p in failed)
        where = ", ".join(sorted({p.member.provider for p in failed}))
        draft.note("Failed", f"retired {len(failed)} failed on {where}")


def _scale(pool: PoolView, state: _State, draft: _Draft, now: datetime) -> None:
    """Add the members short of ``replicas`` (on the providers furthest below their share), or
    retire the surplus. A decision that retires failed members retires nothing else: the fold
    takes the provider of every member a ``Failed`` decision retires as failing, so a scale-down
    in it would have a sound provider avoided; the surplus goes at the next evaluation."""
    retired = set(draft.retired)
    active = [p for p in pool.active() if p.member.uid not in retired]
    desired = pool.replicas
    entries, failing = placements(pool, now, draft.failed_on)
    have: dict[str, int] = {}
    for planned in active:
        have[planned.member.provider] = have.get(planned.member.provider, 0) + 1
    if len(active) < desired:
        count = min(desired - len(active), draft.room())
        for _ in range(count):
            provider = next_provider(entries, have, desired)
            have[provider] = have.get(provider, 0) + 1
            draft.added.append(_fresh(pool, draft, provider))
        avoided = f", avoiding {', '.join(failing)}" if failing else ""
        draft.note(
            "ScaleUp",
            f"added {count} ({len(active)} -> {len(active) + count} of {desired}){avoided}",
        )
        return
    surplus = len(active) - desired
    # Shares are judged against every provider of the spread, a failing one included: its
    # members that run stay (only new members avoid it), so a provider that fails creates does
    # not get its running members rebalanced away.
    every = list(pool.spec.spread) or [SpreadEntry(provider=pool.spec.template.provider)]
    if surplus <= 0:
        _rebalance(pool, active, every, usable=entries, have=have, draft=draft)
        return
    if draft.failed_on:
        return
    _shrink(pool, active, entries=every, have=have, surplus=surplus, state=state, draft=draft)


def _rebalance(
    pool: PoolView,
    active: Sequence[Planned],
    entries: Sequence[SpreadEntry],
    *,
    usable: Sequence[SpreadEntry],
    have: Mapping[str, int],
    draft: _Draft,
) -> None:
    """At the desired count but off the weights (they changed, or a provider failed): one new
    member where a provider is short, within ``maxSurge``; the scale-down that follows takes the
    surplus from a provider over its share once the new member is Ready."""
    desired = pool.replicas
    if not desired:
        return
    over = over_share(entries, have, desired)
    if not over or len(active) >= desired + pool.spec.max_surge:
        return
    provider = next_provider(usable, have, desired)
    if provider in over:
        return
    draft.added.append(_fresh(pool, draft, provider))
    draft.note("Spread", f"added 1 on {provider}, to take over from {over[0]}")


def _shrink(
    pool: PoolView,
    active: Sequence[Planned],
    *,
    entries: Sequence[SpreadEntry],
    have: Mapping[str, int],
    surplus: int,
    state: _State,
    draft: _Draft,
) -> None:
    """Retire ``surplus`` members, never a leased one: those on a provider over its share first,
    then the unready and unhealthy, then the oldest. A Ready member goes only while more are
    Ready than wanted, so a rebalance or a scale-down never leaves the pool short. Only a
    provider's members beyond its share go (there are always ``surplus`` of them): the member a
    rebalance added where a provider was short stays, unready as it is, until the one it takes
    over from can go, instead of being retired and added again at every evaluation."""
    desired = pool.replicas
    over = over_share(entries, have, desired)
    rank = {p: i for i, p in enumerate(over)}
    want = shares(desired, entries)
    beyond = {p: n - want.get(p, 0) for p, n in have.items()}

    def order(planned: Planned) -> tuple[int, int, int, str, int]:
        s = state(planned)
        since = s.since.isoformat() if s.since is not None else planned.planned_at.isoformat()
        usable = int(s.ready and s.healthy)
        return (
            rank.get(planned.member.provider, len(over)),
            usable,
            int(s.ready),
            since,
            planned.member.ordinal,
        )

    ready = sum(state(p).ready for p in active)
    limit = min(surplus, draft.room())
    victims: list[Planned] = []
    waiting = 0
    for planned in sorted(active, key=order):
        if len(victims) >= limit:
            break
        provider = planned.member.provider
        if beyond.get(provider, 0) <= 0:
            continue
        s = state(planned)
        if s.leased:
            waiting += 1
            continue
        if s.ready:
            if ready <= desired:
                continue
            ready -= 1
        victims.append(planned)
        beyond[provider] -= 1
    if victims:
        draft.retired += [p.member.uid for p in victims]
        leased = min(waiting, limit - len(victims))
        wait = f", {leased} leased wait for their leases" if leased else ""
        draft.note(
            "ScaleDown",
            f"retired {len(victims)} ({len(active)} -> {len(active) - len(victims)} of {desired})"
            + wait,
        )


def _recycle(pool: PoolView, state: _State, draft: _Draft, now: datetime) -> None:
    """Members older than ``maxAge``, or blocked by ``recycleOnBlocks`` distinct targets, get a
    fresh instance, at most ``maxSurge`` rotating at once."""
    spec = pool.spec
    if not spec.max_age_seconds and not spec.recycle_on_blocks:
        return
    active = [p for p in pool.active() if p.member.uid not in draft.retired]
    budget = spec.max_surge - sum(state(p).rotating for p in active)
    aged: list[Planned] = []
    blocked: list[Planned] = []
    for planned in active:
        s = state(planned)
        if not s.declared or not s.ready or s.rotating or s.deleting:
            continue
        if spec.recycle_on_blocks and s.blocked_targets >= spec.recycle_on_blocks:
            blocked.append(planned)
        elif (
            spec.max_age_seconds
            and s.since is not None
            and (now - s.since).total_seconds() >= spec.max_age_seconds
        ):
            aged.append(planned)
    for reason, group in (("Blocked", blocked), ("MaxAge", aged)):
        group.sort(key=lambda p: (state(p).since or p.planned_at, p.member.ordinal))
        taken = group[: max(budget, 0)]
        budget -= len(taken)
        if taken:
            draft.recycled += [p.member.uid for p in taken]
            what = "blocked by enough targets" if reason == "Blocked" else "past maxAge"
            draft.note(reason, f"recycled {len(taken)} {what}")


def _roll(pool: PoolView, state: _State, draft: _Draft) -> None:
    """Members declared with an older template are declared again with the current one, at most
    ``maxSurge`` not Ready or rotating at once (the reconciler replaces a leased one
    make-before-break)."""
    active = [p for p in pool.active() if p.member.uid not in draft.retired]

    def busy(planned: Planned) -> bool:
        """Rotating, not Ready, not yet reconciled, or rolled and not yet seen re-declared."""
        s = state(planned)
        rolling = (
            planned.generation == pool.generation
            and planned.generation > 1
            and (s.spec != member_spec(pool.name, pool.spec, planned.member))
        )
        return s.declared and (s.rotating or not s.ready or s.settling or rolling)

    budget = pool.spec.max_surge - sum(busy(p) for p in active) - len(draft.recycled)
    stale = [
        p
        for p in active
        if p.generation < pool.generation
        and state(p).declared
        and not state(p).deleting
        and p.member.uid not in draft.recycled
        and state(p).spec != member_spec(pool.name, pool.spec, p.member)
    ]
    taken = stale[: max(budget, 0)]
    if taken:
        draft.rolled += [p.member.uid for p in taken]
        draft.note("Template", f"rolled {len(taken)} to generation {pool.generation}")
