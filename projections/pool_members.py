"""What the shared views say of a pool's members, and the figures counted from it
(docs/architecture.md, "Pools").

Read by every service that shows or decides on a pool: the pool controller decides on these
figures, and discovery answers ``GET /v1/pools`` with them, so both count a member alike. They
live here, beside the folds they read, because two services of one layer may not import each
other. Pure: ``now`` is passed in.

The member's age is its current instance's (a rotation renews it), its blocks the distinct
targets that blocked it since that instance took over (a fresh address starts clean).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

import msgspec

from events.pool import PoolFigures
from events.schemas import Phase, ProxySpec
from projections.lease import LeaseView
from projections.lease_queries import is_available, is_free, leasable
from projections.pool import Planned, PoolView
from projections.proxy import COMPLETED, ProxyView


class MemberState(msgspec.Struct, frozen=True, kw_only=True):
    uid: str
    declared: bool = False
    """A Proxy exists for it (declared, not removed)."""
    deleting: bool = False
    phase: str = ""
    ready: bool = False
    healthy: bool = False
    leased: bool = False
    rotating: bool = False
    failed: bool = False
    since: datetime | None = None
    """When its current instance took over (or was created); None before it has one."""
    blocked_targets: int = 0
    spec: ProxySpec | None = None
    settling: bool = False
    """Its latest declaration is not yet reconciled (``observedGeneration`` behind): a member
    just rolled is busy before the reconciler has even marked it rotating."""


def member_state(
    uid: str, proxy: ProxyView | None, lease: LeaseView | None, now: datetime
) -> MemberState:
    if proxy is None or proxy.removed:
        return MemberState(uid=uid)
    since = _instance_since(proxy)
    leased = False
    blocked = 0
    if lease is not None:
        leased = not is_free(lease, now)
        blocked = sum(
            1
            for backoff in lease.reports.backoffs.values()
            if since is None or backoff.reported_at >= since
        )
    rotating = proxy.replacement is not None or (
        proxy.rotation is not None and proxy.rotation.in_progress
    )
    return MemberState(
        uid=uid,
        declared=True,
        deleting=proxy.deleting,
        phase=str(proxy.phase),
        ready=proxy.phase is Phase.READY,
        healthy=bool(proxy.healthy),
        leased=leased,
        rotating=rotating,
        failed=proxy.phase is Phase.FAILED,
        since=since,
        blocked_targets=blocked,
        spec=proxy.spec,
        settling=proxy.generation > proxy.observed_generation,
    )


def member_states(
    planned: Iterable[Planned],
    proxies: Mapping[str, ProxyView],
    leases: Mapping[str, LeaseView],
    now: datetime,
) -> dict[str, MemberState]:
    """uid -> state of each of ``planned`` (``pool.members.values()``, ``pool.active()``)."""
    return {
        p.member.uid: member_state(
            p.member.uid, proxies.get(p.member.uid), leases.get(p.member.uid), now
        )
        for p in planned
    }


def available_members(
    pool: PoolView,
    proxies: Mapping[str, ProxyView],
    leases: Mapping[str, LeaseView],
    now: datetime,
) -> list[str]:
    """The active members a lease request naming the pool could get now: leasable (Ready,
    healthy, with an address, not being deleted) and free, past any cooldown."""
    found = []
    for planned in pool.active():
        uid = planned.member.uid
        proxy = proxies.get(uid)
        if proxy is not None and leasable(proxy) and is_available(leases.get(uid), now):
            found.append(uid)
    return found


def _instance_since(proxy: ProxyView) -> datetime | None:
    """The current instance's start: its promotion if a rotation brought it, else the first
    time the proxy had it (the view keeps no creation time per instance, so the declaration or
    the last promotion stands for it)."""
    rotation = proxy.rotation
    if rotation is not None and rotation.state == COMPLETED and rotation.ended_at is not None:
        return rotation.ended_at
    return proxy.created_at


def figures(pool: PoolView, states: Mapping[str, MemberState]) -> PoolFigures:
    """The pool's figures: the members it wants now (an undeclared one counts, as not Ready)."""
    active = [states.get(p.member.uid, MemberState(uid=p.member.uid)) for p in pool.active()]
    return PoolFigures(
        desired=pool.replicas,
        members=len(active),
        ready=sum(s.ready for s in active),
        healthy=sum(s.ready and s.healthy for s in active),
        leased=sum(s.leased for s in active),
        rotating=sum(s.rotating for s in active),
    )
