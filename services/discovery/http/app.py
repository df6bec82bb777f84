"""The Litestar app: routes, error mapping, auth and the OpenAPI document.

Routes (the reference is ``docs/api.md``; the schema is served at ``/schema``):

- ``GET /healthz``, ``GET /metrics`` — open, untraced
- ``GET /v1/proxies[?phase=Ready&healthy=true&attr.<key>=<value>&egress.country=DE...]``,
  ``GET /v1/proxies/{uid}``
- ``POST /v1/leases`` (201), ``GET /v1/leases/{lease_id}``, ``PATCH /v1/leases/{lease_id}``
  (renew), ``DELETE /v1/leases/{lease_id}`` (204), ``POST /v1/leases/{lease_id}/report`` (204),
  ``POST /v1/leases/{lease_id}/rotate`` (202: a fresh instance, make-before-break),
  ``GET /v1/leases/{lease_id}/rotation`` (its progress)
- ``GET /v1/leases?holder=X``, ``DELETE /v1/leases?holder=X``: a holder's own leases
- ``GET /v1/pools[?namespace=X]``, ``GET /v1/pools/{namespace}/{name}`` (``pools``)

Each ``/v1`` route names the scope it needs (``opt={"scope": ...}``); the guard of ``access``
identifies the client, and a lease route serves only the client that acquired the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from litestar import Litestar, Request, Response, Router, delete, get, patch, post
from litestar.di import NamedDependency, Provide
from litestar.exceptions import HTTPException
from litestar.openapi.config import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme
from litestar.params import FromPath, FromQuery, HeaderParameter, JSONBody
from litestar.types import ExceptionHandlersMap, Guard
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from events.errors import StoreUnavailable
from projections.lease_queries import find
from projections.proxy import ProxyView
from services.discovery.console import console_router
from services.discovery.console.session import Sessions
from services.discovery.http.access import (
    LeaseLimit,
    access_metrics,
    caller,
    check_acquire,
    check_owner,
    guard,
)
from services.discovery.http.bodies import strict_body
from services.discovery.http.errors import (
    ApiError,
    Unavailable,
    UnknownProxy,
    error_responses,
    on_api_error,
    on_http_exception,
    on_store_unavailable,
    on_unexpected,
)
from services.discovery.http.models import (
    AcquireRequest,
    Health,
    LeaseList,
    LeaseOut,
    ProxyDetail,
    ProxyList,
    ProxyOut,
    Released,
    RenewRequest,
    ReportRequest,
    egress_of,
    lease_out,
    proxy_detail,
    proxy_out,
)
from services.discovery.http.pools import ROUTES as POOL_ROUTES
from services.discovery.http.pools import checked_pool, known_pool
from services.discovery.http.queries import (
    IDEMPOTENCY_KEY,
    Continue,
    EgressAsn,
    EgressCountry,
    Limit,
    checked_key,
    checked_target,
    lease_key,
    parse_paging,
    parse_proxy_filter,
)
from services.discovery.leasing.credentials import LeaseCredentials
from services.discovery.leasing.holders import checked_holder, held_by, release_all
from services.discovery.leasing.leases import Leases, eligible
from services.discovery.leasing.quota import Limit as LeaseQuota
from services.discovery.leasing.renewal import renew
from services.discovery.leasing.rotation import RotationOut, latest, rotate, rotation_out
from services.discovery.pure.policy import Granted
from services.discovery.pure.pools import bound_selector
from services.discovery.views import Views
from services.runtime.clients import Clients
from services.runtime.observability.metrics import Metrics
from services.runtime.pure.clients import LEASE, READ, Client
from services.runtime.version import VERSION

MAX_BODY_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class DiscoveryApi:
    """What the handlers need; ``problem`` says why the replica cannot serve (None: it can)."""

    leases: Leases
    views: Views
    metrics: Metrics
    problem: Callable[[], str | None] = lambda: None
    credentials: LeaseCredentials | None = None
    """Mints the proxy credentials in every lease answer (D84); None: URLs without them."""


Api = NamedDependency[DiscoveryApi]


_errors = error_responses


IdempotencyKey = Annotated[
    str | None,
    HeaderParameter(
        name=IDEMPOTENCY_KEY,
        required=False,
        description="Any unique text (a UUID) of up to 255 printable ASCII characters. A retry "
        "with the same key and body gets the same lease instead of a second proxy, as long as "
        "the lease is active.",
    ),
]


def _lease(api: Api, granted: Granted) -> LeaseOut:
    proxy = api.views.proxy(granted.view.proxy_uid)
    egress = egress_of(proxy, api.views.candidates)
    return lease_out(granted.record, proxy, api.credentials, egress)


AnyRequest = Request[Any, Any, Any]


async def _own(api: Api, request: AnyRequest, lease_id: str) -> Client:
    """The caller, once the lease is known to be theirs (403 ``not_your_lease`` otherwise). A
    lease this replica has never seen is looked for up to the log's end first; one it cannot
    find is left to the action, which answers 404 as before."""
    client = caller(request)
    found = api.views.find_lease(lease_id)
    record = find(found[0], lease_id) if found else (await api.leases.current(lease_id)).record
    if record is not None:
        check_owner(client, record, access_metrics(api.metrics.registry))
    return client


def _proxy(api: Api, proxy: ProxyView) -> ProxyOut:
    view = api.views.lease_view(proxy.uid)
    return proxy_out(
        proxy,
        view,
        api.views.now(),
        eligible=eligible(api.views, proxy, {}),
        egress=egress_of(proxy, api.views.candidates),
        moved=api.views.bytes_today(proxy),
        spent=api.views.budget_spent(proxy),
    )


# ----------------------------------------------------------------------------------- ops


@get("/healthz", tags=["operations"], responses=_errors(503))
async def healthz(api: Api) -> Health:
    """Answers 200 while this replica can serve: connected to NATS, views caught up."""
    problem = api.problem()
    if problem:
        raise Unavailable(problem)
    return Health(status="ok")


@get("/metrics", tags=["operations"], include_in_schema=False)
async def metrics(api: Api) -> Response[bytes]:
    return Response(api.metrics.render(), media_type=CONTENT_TYPE_LATEST)


# ------------------------------------------------------------------------------- proxies


@get("/proxies", tags=["proxies"], responses=_errors(400, 401, 403), opt={"scope": READ})
async def list_proxies(
    api: Api,
    request: Request[Any, Any, Any],
    *,
    phase: FromQuery[str | None] = None,
    healthy: FromQuery[str | None] = None,
    egress_country: EgressCountry = None,
    egress_asn: EgressAsn = None,
    limit: Limit = None,
    continue_: Continue = None,
) -> ProxyList:
    """Every proxy not removed, by namespace, name and uid. Filters, all of which must match:
    ``phase=Ready``, ``healthy=true|false`` (a proxy not probed yet matches neither),
    ``attr.<key>=<value>``, repeatable, for each attribute the proxy must have, and
    ``egress.country=DE`` / ``egress.asn=AS3320`` for what a site sees of it. With ``limit``
    (1 to 1000), a page: ``continue`` in the answer fetches the next one (same filters), and
    ``total`` counts every match. A proxy added or removed between pages moves no other."""
    # Declared for the OpenAPI document; read with the attr.* parameters.
    del phase, healthy, egress_country, egress_asn, limit, continue_
    paging, rest = parse_paging(request.query_params.multi_items(), "proxies", 3)
    wanted = parse_proxy_filter(rest)
    views = api.views.proxies.views
    if wanted.empty:
        paged = paging.page(api.views.order)
    else:  # the filters' sets intersected, not the fleet walked (D164)
        phase = wanted.phase.value if wanted.phase is not None else None
        found = api.views.candidates.filtered(phase, wanted.healthy, wanted.attributes)
        paged = paging.page_of(api.views.order, found, api.views.key_of)
    return ProxyList(
        items=[_proxy(api, views[uid]) for _, _, uid in paged.keys],
        continue_=paged.token,
        total=paged.total,
    )


@get("/proxies/{uid:str}", tags=["proxies"], responses=_errors(401, 403, 404), opt={"scope": READ})
async def get_proxy(api: Api, uid: FromPath[str]) -> ProxyDetail:
    """One proxy, with the targets it is in back-off for."""
    proxy = api.views.proxy(uid)
    if proxy is None or proxy.removed:
        raise UnknownProxy(f"no proxy {uid!r}")
    return proxy_detail(_proxy(api, proxy), api.views.lease_view(uid), api.views.now())


# -------------------------------------------------------------------------------- leases


@post(
    "/leases",
    tags=["leases"],
    status_code=201,
    responses=_errors(400, 401, 403, 404, 409, 413, 422, 429, 503),
    before_request=strict_body(AcquireRequest),
    opt={"scope": LEASE},
)
async def acquire(
    api: Api,
    request: AnyRequest,
    data: JSONBody[AcquireRequest],
    idempotency_key: IdempotencyKey = None,
) -> LeaseOut:
    """Lease a Ready, healthy proxy whose attributes match every selector pair, exclusively,
    until ``ttlSeconds`` (1 s to 7 days) pass or it is released. A TTL above the server's
    maximum is granted as the maximum (``ttlClamped``). 422 ``no_matching_proxy`` when no proxy
    has those attributes; 503 ``no_proxy_available`` (with ``Retry-After``) when some have them
    but none can be leased now. With an ``Idempotency-Key``, a retry gets the same lease.
    With ``target``, proxies in back-off for that host are skipped; with ``waitSeconds``, a
    request waits up to that long for a proxy to become free. 403 when the client may not use
    that selector, 429 ``lease_limit`` when it holds its ``maxLeases``. With ``pool``
    (``NAMESPACE/NAME``), only that pool's members: 404 ``unknown_pool`` when there is none,
    and a 503 says whether the pool is scaling."""
    client = caller(request)
    pool, selector = checked_pool(data.pool, data.selector)
    refusals = access_metrics(api.metrics.registry)
    check_acquire(client, bound_selector(selector, pool), refusals)
    pool_uid = ""
    if pool is not None:
        pool_uid = (await known_pool(api.views, pool, api.leases.policy.view_timeout)).uid
    # Counted before the grant, not after (D135); a pool's demand counts the client at most this.
    limit = (
        None
        if client.admin or not client.max_leases
        else LeaseQuota(client.name, client.max_leases)
    )
    try:
        granted = await api.leases.acquire(
            selector,
            data.ttl_seconds,
            data.holder,
            key=checked_key(idempotency_key),
            exclude=data.exclude,
            proxy_uid=data.proxy_uid,
            target=checked_target(data.target),
            wait=data.wait_seconds,
            client=client.name,
            pool=pool,
            pool_uid=pool_uid,
            limit=limit,
        )
    except LeaseLimit:
        refusals.refusals.labels("lease_limit").inc()
        raise
    return _lease(api, granted)


@get("/leases", tags=["leases"], responses=_errors(400, 401, 403), opt={"scope": LEASE})
async def list_leases(
    api: Api,
    request: AnyRequest,
    holder: FromQuery[str | None] = None,
    limit: Limit = None,
    continue_: Continue = None,
) -> LeaseList:
    """The caller's active leases of ``holder`` (required; matched exactly), oldest first; an
    admin client sees every client's. With ``limit`` (1 to 1000), a page: ``continue`` in the
    answer fetches the next one, ``total`` counts them all. A lease granted between pages
    comes last; one that ends is simply not listed."""
    del limit, continue_  # declared for the OpenAPI document; read with the holder
    paging, _ = parse_paging(request.query_params.multi_items(), "leases", 2)
    held = {lease_key(g): g for g in held_by(api.leases, checked_holder(holder), caller(request))}
    paged = paging.page(list(held))
    return LeaseList(
        items=[_lease(api, held[key]) for key in paged.keys],
        continue_=paged.token,
        total=paged.total,
    )


@delete(
    "/leases",
    tags=["leases"],
    status_code=200,
    responses=_errors(400, 401, 403, 503),
    opt={"scope": LEASE},
)
async def release_held(
    api: Api, request: AnyRequest, holder: FromQuery[str | None] = None
) -> Released:
    """Release every active lease of ``holder`` (required; matched exactly) that the caller
    acquired (an admin: any client's) and answer how many this request released (0 when it
    held none). 503 when the log failed a release: the others stay released, and sending it
    again releases the rest."""
    released = await release_all(api.leases, checked_holder(holder), caller(request))
    return Released(released=released)


@get(
    "/leases/{lease_id:str}",
    tags=["leases"],
    responses=_errors(401, 403, 404),
    opt={"scope": LEASE},
)
async def get_lease(api: Api, request: AnyRequest, lease_id: FromPath[str]) -> LeaseOut:
    """An active lease; 404 ``unknown_lease`` once it is released or expired."""
    await _own(api, request, lease_id)
    return _lease(api, await api.leases.current(lease_id))


@patch(
    "/leases/{lease_id:str}",
    tags=["leases"],
    responses=_errors(400, 401, 403, 404, 413, 503),
    before_request=strict_body(RenewRequest),
    opt={"scope": LEASE},
)
async def renew_lease(
    api: Api, request: AnyRequest, lease_id: FromPath[str], data: JSONBody[RenewRequest]
) -> LeaseOut:
    """Renew an active lease: it now ends ``ttlSeconds`` from now (the log's time; clamped to
    the server's maximum, ``ttlClamped``; it may also end sooner than before). The fencing
    token stays. 404 ``unknown_lease`` once it is released or expired, here or on any replica."""
    client = await _own(api, request, lease_id)
    return _lease(api, await renew(api.leases, lease_id, data.ttl_seconds, client=client.name))


@delete(
    "/leases/{lease_id:str}",
    tags=["leases"],
    status_code=204,
    responses=_errors(401, 403, 404, 503),
    opt={"scope": LEASE},
)
async def release(api: Api, request: AnyRequest, lease_id: FromPath[str]) -> None:
    """End an active lease; the proxy cools down before its next lease. 404 ``unknown_lease``
    when the lease is unknown, already released or expired."""
    client = await _own(api, request, lease_id)
    await api.leases.release(lease_id, client=client.name)


@post(
    "/leases/{lease_id:str}/report",
    tags=["leases"],
    status_code=204,
    responses=_errors(400, 401, 403, 404, 413, 503),
    before_request=strict_body(ReportRequest),
    opt={"scope": LEASE},
)
async def report(
    api: Api, request: AnyRequest, lease_id: FromPath[str], data: JSONBody[ReportRequest]
) -> None:
    """Record how the work through the proxy went (``success``, ``blocked``, ``failed``), while
    the lease is active; 404 ``unknown_lease`` otherwise."""
    client = await _own(api, request, lease_id)
    await api.leases.report(lease_id, data.outcome, data.target, data.detail, client=client.name)


@post(
    "/leases/{lease_id:str}/rotate",
    tags=["leases"],
    status_code=202,
    responses=_errors(401, 403, 404, 409, 503),
    opt={"scope": LEASE},
)
async def rotate_lease(api: Api, request: AnyRequest, lease_id: FromPath[str]) -> RotationOut:
    """Ask for a fresh instance (a fresh IP) of the lease's proxy without downtime: a
    replacement is made and probed first, then the lease switches to it (new ``proxy`` and a
    higher ``fencingToken``), then the old instance is deleted. 202 with the rotation; asking
    while one is under way answers that one. 404 ``unknown_lease`` unless the lease is active;
    409 ``not_rotatable`` for a proxy being deleted or External."""
    client = await _own(api, request, lease_id)
    rotation, granted = await rotate(api.leases, lease_id, client=client.name)
    return rotation_out(rotation, _lease(api, granted))


@get(
    "/leases/{lease_id:str}/rotation",
    tags=["leases"],
    responses=_errors(401, 403, 404),
    opt={"scope": LEASE},
)
async def get_rotation(api: Api, request: AnyRequest, lease_id: FromPath[str]) -> RotationOut:
    """The lease's latest rotation, to wait for its end: ``completed`` once the lease has
    switched (its ``proxy`` and ``fencingToken`` are the new ones), or ``failed``/``cancelled``.
    404 ``unknown_lease`` unless the lease is active; 404 ``no_rotation`` if it never asked."""
    await _own(api, request, lease_id)
    rotation, granted = await latest(api.leases, lease_id)
    return rotation_out(rotation, _lease(api, granted))


# ----------------------------------------------------------------------------------- app


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    ApiError: on_api_error,
    StoreUnavailable: on_store_unavailable,
    HTTPException: on_http_exception,
    Exception: on_unexpected,
}


def create_app(
    api: DiscoveryApi,
    *,
    token: str | None = None,
    clients: Clients | None = None,
    max_body_size: int = MAX_BODY_BYTES,
) -> Litestar:
    """``clients``: who may call (``services.runtime.clients``); without it, ``token`` alone is
    one admin client and no token at all leaves the API open."""
    clients = clients if clients is not None else Clients(token=token)
    guards: list[Guard] = [guard(clients, access_metrics(api.metrics.registry))]
    sessions = Sessions(clients, api.views.js)

    @contextlib.asynccontextmanager
    async def following(_: Litestar) -> AsyncIterator[None]:
        """The clients file and the console's logouts are followed while the app serves."""
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(clients.run()), group.create_task(sessions.run())]
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()

    v1 = Router(
        "/v1",
        route_handlers=[
            list_proxies,
            get_proxy,
            acquire,
            list_leases,
            release_held,
            get_lease,
            renew_lease,
            release,
            report,
            rotate_lease,
            get_rotation,
            *POOL_ROUTES,
        ],
        guards=guards,
        security=[{"bearer": []}],
    )
    openapi = OpenAPIConfig(
        title="egress-proxies discovery API",
        # The document is the release's (D100); the API's own version is the path, `/v1`.
        version=VERSION,
        description=(
            "List egress proxies and lease them exclusively. Every error answers "
            '`{"error": code, "message": text}`. The `/v1` routes need '
            "`Authorization: Bearer <token>` of a client (the clients file, or DISCOVERY_TOKEN); "
            "a lease is its client's own (403 `not_your_lease` for any other). Bodies "
            'are decoded strictly (`"60"` is not a number). A lease request no proxy can match '
            "is 422 `no_matching_proxy`; one whose matching proxies are all busy, unhealthy or "
            "not Ready is 503 `no_proxy_available`. While NATS is unreachable, writes answer "
            "503 `unavailable` at once and never take effect later; send `Idempotency-Key` to "
            "retry a lease request safely."
        ),
        path="/schema",
        components=Components(
            security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")}
        ),
    )
    return Litestar(
        route_handlers=[healthz, metrics, v1, console_router(api.views, sessions)],
        dependencies={
            "api": Provide(lambda: api, sync_to_thread=False),
            "views": Provide(lambda: api.views, sync_to_thread=False),
        },
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=max_body_size,
        openapi_config=openapi,
        lifespan=[following],
        logging_config=None,
        debug=False,
    )
