"""The Proxy spec a pool declares each member with (docs/architecture.md, "Pools").

What the views say of a member, and the figures counted from it, are
``projections.pool_members``: discovery counts them too, and two services may not import each
other. Pure.
"""

from __future__ import annotations

import msgspec

from events.pool import PoolMember, PoolSpec
from events.poolresource import POOL_ATTRIBUTE
from events.schemas import ProxySpec


def member_spec(pool: str, spec: PoolSpec, member: PoolMember) -> ProxySpec:
    """The Proxy spec a member is declared with: the template, the member's provider, and the
    pool's attribute stamped on."""
    template = spec.template
    attributes = {**template.attributes, POOL_ATTRIBUTE: pool}
    return msgspec.structs.replace(template, provider=member.provider, attributes=attributes)
