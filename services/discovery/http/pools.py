"""Pools in the discovery API (docs/api.md, "Pools"): ``GET /v1/pools[?namespace=]`` and
``GET /v1/pools/{namespace}/{name}``, and what a lease request naming a ``pool`` needs: the
name checked, the pool known, and the candidates kept to its members.

A pool's figures are counted as its controller counts them (``pure.pools``), from the same
proxy and lease views the API leases from, so "3 of 3 Ready" here is what the controller sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import msgspec
from litestar import Request, get
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery

from events.pool import PoolFigures
from projections.pool import PoolView
from projections.pool_members import available_members, member_states
from services.discovery.http.errors import InvalidRequest, UnknownPool, error_responses
from services.discovery.http.models import ConditionOut
from services.discovery.pure.pools import (
    PoolSummary,
    check_namespace,
    conditions,
    pool_selector,
    summarize,
    unknown_pool_hint,
)
from services.discovery.views import Views
from services.runtime.pure.clients import READ
from services.runtime.pure.poolref import PoolRef, parse_pool_ref

ViewsDep = NamedDependency[Views]
POOL_QUERY = frozenset({"namespace"})


class _Out(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pass


class ProviderOut(_Out, frozen=True, kw_only=True):
    members: int
    ready: int


class FiguresOut(_Out, frozen=True, kw_only=True):
    desired: int
    members: int
    ready: int
    healthy: int
    leased: int
    rotating: int


class DecisionOut(_Out, frozen=True, kw_only=True):
    reason: str
    """``ScaleUp``, ``ScaleDown``, ``Failed``, ``Spread``, ``MaxAge``, ``Blocked``,
    ``Template`` or ``Deleting``: the first of these the decision did."""
    message: str
    figures: FiguresOut
    """What the controller saw when it decided."""
    at: datetime | None
    """When it was recorded (the log's time)."""


class PoolOut(_Out, frozen=True, kw_only=True):
    uid: str
    namespace: str
    name: str
    desired: int
    """The replicas the pool asks for (its spec's, or the last scale's)."""
    members: int
    """Members it wants now, declared or about to be."""
    ready: int
    healthy: int
    """Ready and found healthy by the health service."""
    leased: int
    available: int
    """Members a lease request could get now: Ready, healthy, not leased, not cooling down."""
    rotating: int
    providers: dict[str, ProviderOut]
    """Per provider: its members and how many are Ready."""
    conditions: list[ConditionOut]
    """``Ready`` (every member it wants is there and Ready) and ``Scaling`` (members are being
    added or are not Ready yet)."""
    deleting: bool
    last_decision: DecisionOut | None
    """The controller's last decision about the pool; None before its first."""


class PoolList(_Out, frozen=True, kw_only=True):
    items: list[PoolOut]


def _figures(seen: PoolFigures) -> FiguresOut:
    return FiguresOut(
        desired=seen.desired,
        members=seen.members,
        ready=seen.ready,
        healthy=seen.healthy,
        leased=seen.leased,
        rotating=seen.rotating,
    )


def summary(views: Views, pool: PoolView) -> PoolSummary:
    """The pool's figures now, from the proxy and lease views."""
    now = views.now()
    proxies, leases = views.proxies.views, views.leases.views
    states = member_states(pool.active(), proxies, leases, now)
    available = available_members(pool, proxies, leases, now)
    return summarize(pool, states, available)


def pool_out(views: Views, pool: PoolView) -> PoolOut:
    got = summary(views, pool)
    seen = got.figures
    decision = pool.last_decision
    return PoolOut(
        uid=pool.uid,
        namespace=pool.namespace,
        name=pool.name,
        desired=seen.desired,
        members=seen.members,
        ready=seen.ready,
        healthy=seen.healthy,
        leased=seen.leased,
        available=got.available,
        rotating=seen.rotating,
        providers={
            name: ProviderOut(members=c.members, ready=c.ready) for name, c in got.providers.items()
        },
        conditions=[
            ConditionOut(type=c.type, status=c.status, reason=c.reason, message=c.message)
            for c in conditions(pool, got)
        ],
        deleting=pool.deleting,
        last_decision=None
        if decision is None
        else DecisionOut(
            reason=decision.reason,
            message=decision.message,
            figures=_figures(decision.figures),
            at=pool.decided_at,
        ),
    )


def parse_pool_query(query: Iterable[tuple[str, str]]) -> str | None:
    """``GET /v1/pools``'s query: ``namespace`` or nothing. Anything else is refused, as on
    ``GET /v1/proxies``: a misspelt filter would otherwise answer every pool."""
    namespace: str | None = None
    for key, value in query:
        if key not in POOL_QUERY:
            raise InvalidRequest(
                f"unknown query parameter {key[:100]!r}; filter with namespace=<namespace>"
            )
        try:
            namespace = check_namespace(value)
        except ValueError as exc:
            raise InvalidRequest(f"namespace: {exc}") from None
    return namespace


def checked_pool(
    pool: str | None, selector: Mapping[str, str]
) -> tuple[PoolRef | None, dict[str, str]]:
    """A lease request's ``pool`` (None: the request names none) and the selector it leases
    with, or a 400 naming ``pool``."""
    if pool is None:
        return None, dict(selector)
    try:
        ref = parse_pool_ref(pool)
        return ref, pool_selector(selector, ref)
    except ValueError as exc:
        raise InvalidRequest(f"pool: {exc}") from None


def unknown(views: Views, ref: PoolRef) -> UnknownPool:
    """The 404 for ``ref``, naming pools of that name in other namespaces, or those there are."""
    hint = unknown_pool_hint(ref, [PoolRef(p.namespace, p.name) for p in views.all_pools()])
    return UnknownPool(f"pool: no pool {str(ref)!r}; {hint}")


async def known_pool(views: Views, ref: PoolRef, timeout: float) -> PoolView:
    """The pool a lease request names, or a 404 once this replica has read the POOL stream to
    its end (so a pool declared a moment ago, on any replica, is found)."""
    pool = views.pool(ref.namespace, ref.name)
    if pool is None:
        await views.reach_pool_log_end(timeout)
        pool = views.pool(ref.namespace, ref.name)
    if pool is None:
        raise unknown(views, ref)
    return pool


def members_only(views: Views, uids: list[str], pool: PoolRef | None) -> list[str]:
    """The uids in the pool's namespace (the candidates carry its attribute already): a proxy
    of another namespace with the same attribute is no member."""
    if pool is None:
        return uids
    kept = []
    for uid in uids:
        proxy = views.proxy(uid)
        if proxy is not None and proxy.namespace == pool.namespace:
            kept.append(uid)
    return kept


# ---------------------------------------------------------------------------------- routes


@get("/pools", tags=["pools"], responses=error_responses(400, 401, 403), opt={"scope": READ})
async def list_pools(
    views: ViewsDep, request: Request[Any, Any, Any], namespace: FromQuery[str | None] = None
) -> PoolList:
    """Every pool not removed, by namespace and name, with its members' figures and its
    controller's last decision; ``namespace=`` keeps one namespace's."""
    del namespace  # declared for the OpenAPI document; read with the check of every parameter
    only = parse_pool_query(request.query_params.multi_items())
    pools = views.all_pools()
    return PoolList(
        items=[pool_out(views, p) for p in pools if only is None or p.namespace == only]
    )


@get(
    "/pools/{namespace:str}/{name:str}",
    tags=["pools"],
    responses=error_responses(401, 403, 404),
    opt={"scope": READ},
)
async def get_pool(views: ViewsDep, namespace: FromPath[str], name: FromPath[str]) -> PoolOut:
    """One pool; 404 ``unknown_pool`` when there is none of that namespace and name."""
    pool = views.pool(namespace, name)
    if pool is None:
        raise unknown(views, PoolRef(namespace[:100], name[:100]))
    return pool_out(views, pool)


ROUTES = [list_pools, get_pool]
