"""The console's pools pages (docs/pools.md, "The console"):

- ``GET /ui/pools[?at=]``: every pool with its figures and conditions; ``.../live``: its table
- ``GET /ui/pools/{namespace}/{name}[?at=]``: one pool's spec, members by state, spread and
  scaling timeline; ``.../live``: the same, in part

Live, they read the replica's views, as the fleet page does; a time travel folds the POOL stream
with the PROXY and LEASE streams up to the instant (``history.History.fleet_at``), with the same
bounds per replica and per client. The timeline is read from the pool's aggregate in the log:
the fold keeps only the last decision.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import partial
from typing import Any

from litestar import Response, get
from litestar.params import FromPath

from events.subjects import InvalidToken, check_token
from projections.lease import LeaseView
from projections.pool import PoolView
from projections.proxy import ProxyView
from services.discovery.console.history import Cost
from services.discovery.console.pure.pools import (
    age,
    by_state,
    members,
    pool_line,
    pool_lines,
    spec_line,
    spread,
    timeline,
)
from services.discovery.console.render import local_input, page, pool_path, query
from services.discovery.console.routes import (
    GONE,
    LIVE,
    AnyRequest,
    Console,
    ConsoleDep,
    _at,
    _client_key,
    _Gone,
    _html,
    _login_redirect,
    _Refused,
    _refused,
    _travel,
)

FOUND_WITHIN = 1.0
"""Seconds a live pool page waits for the replica to read the POOL stream to its end before it
answers 404, so a pool declared a moment ago (on any replica) is found."""
SHOWN = 100
"""Characters of a path's namespace or name quoted back in a 404 at most."""


def _only_at(request: AnyRequest) -> None:
    """The pools pages take ``at`` alone: anything else is refused, as on the fleet page, rather
    than ignored."""
    for key in request.query_params:
        if key != "at":
            raise _Refused(400, f"unknown query parameter {key[:60]!r}; the pools pages take at=")


Views3 = tuple[dict[str, PoolView], dict[str, ProxyView], dict[str, LeaseView]]


async def _views_at(
    console: Console, request: AnyRequest, at: datetime | None
) -> tuple[Views3, datetime, Cost]:
    """The pools (by the token of their subjects), proxies and leases now (the replica's views)
    or as folded up to ``at``."""
    views = console.views
    if at is None:
        return (views.pools.views, views.proxies.views, views.leases.views), views.now(), LIVE
    got = await _travel(request, console.history.fleet_at(at, _client_key(console, request)))
    return (got.pools, got.proxies, got.leases), at, got.cost


def _common(console: Console, at: datetime | None, now: datetime, cost: Cost) -> dict[str, Any]:
    return {
        "at": at,
        "now": now,
        "cost": cost,
        "at_query": query([("at", local_input(at))]),
        "signed_in": console.session.required,
    }


async def _pools(console: Console, request: AnyRequest) -> dict[str, Any]:
    _only_at(request)
    at = _at(console, request)
    (pools, proxies, leases), now, cost = await _views_at(console, request, at)
    return {
        "lines": pool_lines(pools.values(), proxies, leases, now),
        "live_url": "/ui/pools/live",
        **_common(console, at, now, cost),
    }


async def _found(console: Console, request: AnyRequest, namespace: str, name: str) -> PoolView:
    """The live pool of that namespace and name, once the replica has read the POOL stream to
    its end if it did not know it."""
    pool = console.views.pool(namespace, name)
    if pool is None:
        await _travel(request, console.views.reach_pool_log_end(FOUND_WITHIN))
        pool = console.views.pool(namespace, name)
    if pool is None:
        raise _Refused(404, f"no pool {namespace[:SHOWN]}/{name[:SHOWN]} in the log")
    return pool


def _found_then(pools: dict[str, PoolView], namespace: str, name: str) -> tuple[str, PoolView]:
    """The pool of that namespace and name among the pools folded up to an instant, with the
    token of its subjects (a hand-written event may give the pool another uid in its body)."""
    for key, pool in sorted(pools.items()):
        if (pool.namespace, pool.name) == (namespace, name) and not pool.removed:
            return key, pool
    raise _Refused(404, f"no pool {namespace[:SHOWN]}/{name[:SHOWN]} in the log at that time")


async def _pool(console: Console, request: AnyRequest, namespace: str, name: str) -> dict[str, Any]:
    _only_at(request)
    at = _at(console, request)
    (pools, proxies, leases), now, cost = await _views_at(console, request, at)
    if at is None:
        pool = await _found(console, request, namespace, name)
        key = pool.uid  # the replica indexes a pool under the uid its subjects carry
    else:
        key, pool = _found_then(pools, namespace, name)
    try:
        check_token("pool uid", key)
    except InvalidToken as exc:  # a key read off a subject is a token: never, but say so
        raise _Refused(404, str(exc)) from None
    history = await _travel(request, console.history.pool(key, at, _client_key(console, request)))
    entries, left_out = timeline(history.events)
    line = pool_line(pool, proxies, leases, now)
    rows = members(pool, proxies, leases, now)
    path = pool_path(pool.namespace, pool.name)
    return {
        "title": f"{pool.namespace}/{pool.name}",
        "line": line,
        "pool": pool,
        "spec": spec_line(pool.spec),
        "created": age(pool.created_at, now),
        "members": rows,
        "states": by_state(rows),
        "spread": spread(pool, line.providers),
        "entries": entries,
        "left_out": left_out,
        "action": path,
        "live_url": f"{path}/live",
        **_common(
            console,
            at,
            now,
            Cost(
                cost.events + history.cost.events, cost.seconds + history.cost.seconds, cost.notes
            ),
        ),
    }


Build = Callable[[], Awaitable[dict[str, Any]]]


async def _answer(
    console: Console, request: AnyRequest, template: str, build: Build, *, part: bool
) -> Response[Any]:
    """The page (or the part the script swaps in) that ``build`` makes the context of, once
    the session allows it."""
    if not console.session.allows(request):
        return _html("log in again", 401) if part else _login_redirect(request)
    try:
        return _html(page(template, **await build()))
    except _Refused as exc:
        return _refused(console, exc, part=part)
    except _Gone:
        return _html("", GONE)


@get("/pools")
async def pools_page(console: ConsoleDep, request: AnyRequest) -> Response[Any]:
    build = partial(_pools, console, request)
    return await _answer(console, request, "pools.html", build, part=False)


@get("/pools/live")
async def pools_live(console: ConsoleDep, request: AnyRequest) -> Response[Any]:
    build = partial(_pools, console, request)
    return await _answer(console, request, "_pools.html", build, part=True)


@get("/pools/{namespace:str}/{name:str}")
async def pool_page(
    console: ConsoleDep, request: AnyRequest, namespace: FromPath[str], name: FromPath[str]
) -> Response[Any]:
    build = partial(_pool, console, request, namespace, name)
    return await _answer(console, request, "pool.html", build, part=False)


@get("/pools/{namespace:str}/{name:str}/live")
async def pool_live(
    console: ConsoleDep, request: AnyRequest, namespace: FromPath[str], name: FromPath[str]
) -> Response[Any]:
    build = partial(_pool, console, request, namespace, name)
    return await _answer(console, request, "_pool.html", build, part=True)


ROUTES = [pools_page, pools_live, pool_page, pool_live]
