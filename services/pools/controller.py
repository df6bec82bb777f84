"""One evaluation of every pool: decide, record the decision, carry it out (docs/architecture.md,
"Pools").

The decision is appended to the pool's aggregate with its expected last sequence, decided on the
pool as the log holds it (``decide_and_append``), so two replicas deciding at once record one
decision; the loser folds the winner's and finds nothing left to do. Carrying it out is
level-triggered and idempotent: every evaluation declares each planned member that has no Proxy
and deletes each retired member that still has one, so a ``kill -9`` between the decision and
its declarations is finished by the next evaluation, on any replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import structlog

from commands.declaring import Declaration, apply, delete
from commands.rotating import request_rotation
from events import subjects
from events.pool import MAX_MEMBERS_PER_DECISION, PoolMember
from events.store import EventStore, History, NewEvent, decide_and_append, derive_msg_id
from projections import pool as pool_fold
from projections.lease import LeaseView
from projections.pool import PoolView
from projections.pool_demand import Demand
from projections.pool_members import MemberState, member_states
from projections.proxy import ProxyView
from services.pools.pure.decide import Decision, decide
from services.pools.pure.members import member_spec
from services.pools.pure.record import recorded_as

log = structlog.get_logger("egress.pools")

GROWTH_DECISIONS = 10
"""Decisions one evaluation records while a pool grows (each adds at most
``MAX_MEMBERS_PER_DECISION``) before it declares their members together: a pool of 1,000 is
planned in one evaluation, not ten, each waiting for the last one's declarations."""
CONCURRENT_WRITES = 16
"""Member declarations and deletions one evaluation has in flight at once: each is a read and an
optimistic append on its own aggregate, so they do not meet; one at a time, a pool of 1,000
took 3.5 times as long to declare as a script declaring the same Proxies (docs/benchmarks.md,
"Pools")."""


def source_of(pool: PoolView) -> str:
    """What a member's ``ProxyDeclared.source`` says: the pool that owns it."""
    return f"pool/{pool.namespace}/{pool.name}"


@dataclass(slots=True)
class Outcome:
    """What one evaluation of one pool did (for logs, metrics and tests)."""

    decision: Decision | None = None
    declared: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    rotated: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    """Members whose name a Proxy of someone else's holds: not taken over."""

    @property
    def growing(self) -> bool:
        """The decision only added members, as many as one may: the pool is growing."""
        d = self.decision
        return (
            d is not None
            and len(d.added) >= MAX_MEMBERS_PER_DECISION
            and not (d.retired or d.recycled or d.rolled)
        )

    @property
    def more(self) -> bool:
        """The decision was cut at ``MAX_MEMBERS_PER_DECISION``: evaluate again at once, not at
        the next tick."""
        d = self.decision
        return d is not None and len(d.added) + len(d.retired) >= MAX_MEMBERS_PER_DECISION


class Controller:
    def __init__(self, store: EventStore) -> None:
        self.store = store

    async def evaluate(
        self,
        pool: PoolView,
        proxies: Mapping[str, ProxyView],
        leases: Mapping[str, LeaseView],
        now: datetime,
        demand: Demand | None = None,
    ) -> Outcome:
        outcome = Outcome()
        states = member_states(pool.members.values(), proxies, leases, now)
        recorded = await self._record(pool.uid, states, now, outcome, demand)
        for _ in range(GROWTH_DECISIONS - 1):
            if recorded is None or recorded.removed or not outcome.growing:
                break
            # Pure growth cut at its bound: plan the next members now, and declare them all
            # together below, instead of one decision's members per evaluation.
            recorded = await self._record(pool.uid, states, now, outcome, demand)
        if recorded is None or recorded.removed:
            return outcome
        await self._carry_out(recorded, proxies, states, outcome)
        return outcome

    async def _record(
        self,
        uid: str,
        states: Mapping[str, MemberState],
        now: datetime,
        outcome: Outcome,
        demand: Demand | None,
    ) -> PoolView | None:
        """Decide on the pool as the log holds it and append the decision; the pool as it
        stands after (None if it is not in the log)."""
        folded: list[PoolView | None] = [None]

        def decide_on(history: History) -> list[NewEvent]:
            view = pool_fold.fold(list(history.events))
            folded[0] = view
            outcome.decision = None
            if view is None:
                return []
            decision = decide(view, states, now, demand)
            outcome.decision = decision
            if decision is None:
                return []
            after = str(history.last_seq)
            event = recorded_as(decision, view)
            what = "pool-removed" if decision.remove else "pool-decided"
            return [NewEvent(event, derive_msg_id(uid, what, after))]

        aggregate = subjects.pool(uid)
        result = await decide_and_append(self.store, aggregate, decide_on)
        if not result.seqs:
            return folded[0]
        # Carried out as the log now holds the pool (with its members' uids and generations).
        return pool_fold.fold(list((await self.store.read(aggregate)).events))

    async def _carry_out(
        self,
        pool: PoolView,
        proxies: Mapping[str, ProxyView],
        states: Mapping[str, MemberState],
        outcome: Outcome,
    ) -> None:
        source = source_of(pool)
        declarations: list[Declaration] = []
        for planned in pool.active():
            member = planned.member
            proxy = proxies.get(member.uid)
            if proxy is not None and not proxy.removed and proxy.source != source:
                outcome.refused.append(member.name)
                continue
            state = states.get(member.uid)
            spec = member_spec(pool.name, pool.spec, member)
            # Declared with the template it was planned or rolled with: nothing to do. (A member
            # of an older generation waits for a decision to roll it, within maxSurge.)
            current = planned.generation < pool.generation or (
                state is not None and state.spec == spec
            )
            if state is not None and state.declared and current:
                continue
            declarations.append(
                Declaration(
                    uid=member.uid,
                    namespace=pool.namespace,
                    name=member.name,
                    spec=spec,
                    source=source,
                    cloud_init=spec.cloud_init.inline if spec.cloud_init is not None else "",
                )
            )
        retiring: list[PoolMember] = []
        for planned in pool.retired():
            member = planned.member
            state = states.get(member.uid)
            proxy = proxies.get(member.uid)
            if state is None or not state.declared or state.deleting:
                continue
            if proxy is not None and proxy.source != source:
                continue
            retiring.append(member)

        async def declare(declaration: Declaration) -> None:
            applied = await apply(self.store, declaration)
            if applied.result in ("created", "changed"):
                outcome.declared.append(declaration.name)

        async def retire(member: PoolMember) -> None:
            applied = await delete(self.store, pool.namespace, member.name, member.uid)
            if applied.result == "deleted":
                outcome.deleted.append(member.name)

        await _bounded([declare(d) for d in declarations] + [retire(m) for m in retiring])
        if outcome.decision is not None:
            for uid in outcome.decision.recycled:
                if await self._rotate(uid, pool):
                    outcome.rotated.append(uid)

    async def _rotate(self, uid: str, pool: PoolView) -> bool:
        """Ask for a fresh instance of a member, as a lease holder's ``rotate`` does; nothing if
        a rotation is under way already."""
        requested = await request_rotation(
            self.store, uid, cause="pool-rotation", client=source_of(pool)
        )
        if requested == "contended":
            log.warning("a member kept changing while its rotation was asked for", uid=uid)
        return requested == "requested"


async def _bounded(writes: Sequence[Awaitable[None]]) -> None:
    """Run ``writes`` at most ``CONCURRENT_WRITES`` at a time; the first failure ends them all
    and is raised (the next evaluation does what was left, level-triggered)."""
    gate = asyncio.Semaphore(CONCURRENT_WRITES)

    async def one(write: Awaitable[None]) -> None:
        async with gate:
            await write

    try:
        async with asyncio.TaskGroup() as group:
            for write in writes:
                group.create_task(one(write))
    except ExceptionGroup as failed:
        # The caller handles one store error as it would a sequential write's.
        first: BaseException = failed
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from failed
