"""What the pool controller knows of one member: read off the shared proxy and lease views.

Pure: ``now`` is passed in. The controller folds no proxy events of its own; the member's age is
its current instance's (a rotation renews it), its blocks the distinct targets that blocked it
since that instance took over (a fresh address starts clean).
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from events.pool import PoolMember, PoolSpec
from events.poolresource import POOL_ATTRIBUTE
from events.schemas import Phase, ProxySpec
from projections.lease import LeaseView
from projections.lease_queries import is_free
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


def member_spec(pool: str, spec: PoolSpec, member: PoolMember) -> ProxySpec:
    """The Proxy spec a member is declared with: the template, the member's provider, and the
    pool's attribute stamped on."""
    template = spec.template
    attributes = {**template.attributes, POOL_ATTRIBUTE: pool}
    return msgspec.structs.replace(template, provider=member.provider, attributes=attributes)


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
    )


def _instance_since(proxy: ProxyView) -> datetime | None:
    """The current instance's start: its promotion if a rotation brought it, else the first
    time the proxy had it (the view keeps no creation time per instance, so the declaration or
    the last promotion stands for it)."""
    rotation = proxy.rotation
    if rotation is not None and rotation.state == COMPLETED and rotation.ended_at is not None:
        return rotation.ended_at
    return proxy.created_at
