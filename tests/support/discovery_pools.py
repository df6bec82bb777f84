"""Pools as discovery sees them, appended straight to the log (docs/architecture.md, "Pools"):
a pool after its controller's first decision, and its members' Proxies as the controller
declares them and the reconciler and the health service leave them. No controller runs."""

from __future__ import annotations

from typing import Any

from events import subjects
from events.customresource import cli_uid
from events.pool import Autoscale, PoolDecided, PoolDeclared, PoolFigures, PoolMember, PoolSpec
from events.poolresource import member_name
from events.schemas import ProxySpec
from events.store import EventStore, NewEvent
from tests.support.discovery import ready_proxy


def member(pool: str, namespace: str, uid: str, ordinal: int, provider: str) -> PoolMember:
    name = member_name(pool, uid, ordinal)
    return PoolMember(ordinal=ordinal, name=name, uid=cli_uid(namespace, name), provider=provider)


async def declare_pool(
    store: EventStore,
    uid: str,
    namespace: str,
    name: str,
    members: tuple[PoolMember, ...],
    *,
    autoscale: Autoscale | None = None,
) -> None:
    """A pool as its controller leaves it after its first decision: every member planned."""
    spec = PoolSpec(
        replicas=len(members),
        template=ProxySpec(provider="local", attributes={"country": "de"}),
        autoscale=autoscale,
    )
    declared = PoolDeclared(uid=uid, namespace=namespace, name=name, spec=spec)
    decided = PoolDecided(
        uid=uid,
        reason="ScaleUp",
        message=f"added {len(members)} (0 -> {len(members)} of {len(members)})",
        added=members,
        figures=PoolFigures(desired=len(members)),
        generation=1,
    )
    await store.append(
        subjects.pool(uid), [NewEvent(declared, f"{uid}-declared"), NewEvent(decided, f"{uid}-1")]
    )


async def member_proxy(
    store: EventStore, pool: str, planned: PoolMember, namespace: str = "crawl", **kw: Any
) -> None:
    """The member's Proxy as the pool controller declares it (its attribute stamped on) and the
    reconciler and the health service then leave it."""
    await ready_proxy(
        store,
        planned.uid,
        {"country": "de", "pool": pool},
        namespace=namespace,
        name=planned.name,
        provider=planned.provider,
        **kw,
    )
