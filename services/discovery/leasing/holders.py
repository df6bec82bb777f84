"""A holder's own leases: list them, or release them all at once.

A crawler that restarts has lost its lease ids but not its name; these let it find or end what
it held. The holder is the free text the leases were acquired with, matched exactly: a label
within the client, not an identity. The client (``access``) is the identity: a client lists and
releases only the leases it acquired, an admin client any client's
(docs/decisions/0096-a-lease-belongs-to-a-client-a.md). An empty holder is refused: it would name
every lease acquired without one.

Each release is an ordinary ``DELETE /v1/leases/{id}`` (``Leases.release``): the fold decides
each, so a lease that expires or is released elsewhere meanwhile is simply not counted.
"""

from __future__ import annotations

import asyncio

from projections.lease_queries import active
from services.discovery.http.errors import InvalidRequest, UnknownLease
from services.discovery.leasing.leases import Leases
from services.discovery.pure.policy import Granted
from services.runtime.pure.clients import Client

MAX_HOLDER = 256
"""As on ``POST /v1/leases``."""


def checked_holder(holder: str | None) -> str:
    if holder is None or not holder:
        raise InvalidRequest(
            "holder: required; give the holder the leases were acquired with "
            "(?holder=crawler-7), 1 to 256 characters"
        )
    if len(holder) > MAX_HOLDER:
        raise InvalidRequest(f"holder: at most {MAX_HOLDER} characters, as when leasing")
    return holder


def held_by(leases: Leases, holder: str, client: Client) -> list[Granted]:
    """The holder's active leases, oldest first. One per proxy at most, so the list is bounded
    by the fleet and needs no paging."""
    views = leases.views
    now = views.now()
    found: list[Granted] = []
    for view in views.active_leases():
        current = view.current
        if current is not None and current.holder == holder and client.owns(current.client):
            record = active(view, current.lease_id, now)
            if record is not None:
                found.append(Granted(view, record))
    found.sort(key=lambda g: (g.record.acquired_at, g.record.lease_id))
    return found


async def release_all(leases: Leases, holder: str, client: Client) -> int:
    """Release every active lease of ``holder``; how many this request released. A lease that
    ended meanwhile is not counted; if the log failed any release, the answer is 503 (the
    others stay released, and a retry releases the rest)."""
    ids = [g.record.lease_id for g in held_by(leases, holder, client)]
    releases = (leases.release(i, client=client.name) for i in ids)
    results = await asyncio.gather(*releases, return_exceptions=True)
    failures = [r for r in results if r is not None and not isinstance(r, UnknownLease)]
    if failures:
        raise failures[0]
    return sum(1 for r in results if r is None)
