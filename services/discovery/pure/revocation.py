"""When the system ends a lease under its holder, and what the holder is told
(docs/decisions/0139-the-discovery-api-s-edges.md).

A lease holds a proxy, not an instance: while the proxy is being deleted (``delete proxy``, its
pool deleted, or retired by a scale-down that raced the grant) its instance goes away and the
proxy refuses connections, yet the lease would answer 200 for the rest of its TTL. A member
re-declared without its pool's attribute is no member any more, and a lease granted from the
pool would go on holding a proxy outside it. Both end the lease with a reason the log records
(``LeaseReleased.reason``) and its holder's next ``GET`` or renewal answers (410
``lease_revoked``). Pure: the proxy and the lease are the caller's.
"""

from __future__ import annotations

from events.poolresource import POOL_ATTRIBUTE
from projections.lease import LeaseRecord
from projections.proxy import ProxyView

PROXY_DELETED = "proxy_deleted"
LEFT_POOL = "left_pool"
REASONS = (PROXY_DELETED, LEFT_POOL)


def why_revoked(proxy: ProxyView | None, record: LeaseRecord) -> str:
    """The reason the lease must end now, or "" while its proxy still serves it. A proxy this
    replica does not know (yet) is no reason: its view may merely be behind."""
    if proxy is None:
        return ""
    if proxy.deleting or proxy.removed:
        return PROXY_DELETED
    pool = record.selector.get(POOL_ATTRIBUTE)
    if pool is not None and proxy.spec.attributes.get(POOL_ATTRIBUTE) != pool:
        return LEFT_POOL
    return ""


def revoked_message(record: LeaseRecord) -> str:
    """What the holder of a lease ended for ``record.reason`` is told."""
    if record.reason == PROXY_DELETED:
        why = f"its proxy {record.proxy_uid} is being deleted (deleted, or retired by its pool)"
    elif record.reason == LEFT_POOL:
        pool = record.selector.get(POOL_ATTRIBUTE, "")
        why = f"its proxy {record.proxy_uid} is no longer a member of the pool {pool!r}"
    else:
        why = f"the system ended it ({record.reason})"
    return f"lease {record.lease_id} was ended: {why}; lease another proxy"
