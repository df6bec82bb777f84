"""The Litestar app: routes, error mapping, auth and the OpenAPI document.

Routes (the reference is ``docs/api.md``; the schema is served at ``/schema``):

- ``GET /healthz``, ``GET /metrics`` — open, untraced
- ``GET /v1/proxies[?selector=k=v,k=v&available=true]``, ``GET /v1/proxies/{uid}``
- ``POST /v1/leases``, ``GET /v1/leases/{lease_id}``, ``DELETE /v1/leases/{lease_id}``,
  ``POST /v1/leases/{lease_id}/report``
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from litestar import Litestar, Response, Router, delete, get, post
from litestar.di import NamedDependency, Provide
from litestar.exceptions import HTTPException
from litestar.openapi.config import OpenAPIConfig
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import Components, SecurityScheme
from litestar.params import FromPath, FromQuery, JSONBody
from litestar.types import ExceptionHandlersMap, Guard
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from services.discovery.auth import bearer_guard
from services.discovery.errors import (
    ApiError,
    ErrorBody,
    InvalidRequest,
    Unavailable,
    UnknownProxy,
    on_api_error,
    on_http_exception,
    on_unexpected,
)
from services.discovery.leases import Granted, Leases, eligible
from services.discovery.models import (
    AcquireRequest,
    Health,
    LeaseOut,
    ProxyList,
    ProxyOut,
    ReportRequest,
    lease_out,
    proxy_out,
)
from services.discovery.views import Views
from services.runtime.metrics import Metrics

MAX_BODY_BYTES = 64 * 1024
API_VERSION = "1.0.0"


@dataclass(frozen=True, slots=True)
class DiscoveryApi:
    """What the handlers need; ``problem`` says why the replica cannot serve (None: it can)."""

    leases: Leases
    views: Views
    metrics: Metrics
    problem: Callable[[], str | None] = lambda: None


Api = NamedDependency[DiscoveryApi]


def _errors(*statuses: int) -> dict[int, ResponseSpec]:
    return {
        status: ResponseSpec(data_container=ErrorBody, description=f"error ({status})")
        for status in statuses
    }


def parse_selector(text: str | None) -> dict[str, str]:
    """``country=de,tier=gold`` -> ``{"country": "de", "tier": "gold"}``."""
    if not text:
        return {}
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise InvalidRequest(f"selector {text!r}: use key=value pairs separated by commas")
        out[key.strip()] = value.strip()
    return out


def _lease(api: Api, granted: Granted) -> LeaseOut:
    proxy = api.views.proxy(granted.view.proxy_uid)
    return lease_out(granted.record, granted.view, proxy, api.views.now())


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


@get("/proxies", tags=["proxies"], responses=_errors(400, 401))
async def list_proxies(
    api: Api, selector: FromQuery[str | None] = None, available: FromQuery[bool | None] = None
) -> ProxyList:
    """Every proxy not removed, by namespace and name. ``selector`` keeps those whose attributes
    include every pair; ``available=true`` keeps those a lease request could get now."""
    wanted = parse_selector(selector)
    now = api.views.now()
    items: list[ProxyOut] = []
    for proxy in sorted(api.views.all_proxies(), key=lambda p: (p.namespace, p.name, p.uid)):
        attributes = proxy.spec.attributes
        if proxy.removed or any(attributes.get(k) != v for k, v in wanted.items()):
            continue
        out = proxy_out(
            proxy, api.views.lease_view(proxy.uid), now, eligible=eligible(proxy, wanted)
        )
        if available is None or out.available == available:
            items.append(out)
    return ProxyList(items=items)


@get("/proxies/{uid:str}", tags=["proxies"], responses=_errors(401, 404))
async def get_proxy(api: Api, uid: FromPath[str]) -> ProxyOut:
    proxy = api.views.proxy(uid)
    if proxy is None or proxy.removed:
        raise UnknownProxy(f"no proxy {uid!r}")
    view = api.views.lease_view(uid)
    return proxy_out(proxy, view, api.views.now(), eligible=eligible(proxy, {}))


# -------------------------------------------------------------------------------- leases


@post("/leases", tags=["leases"], status_code=201, responses=_errors(400, 401, 413, 503))
async def acquire(api: Api, data: JSONBody[AcquireRequest]) -> LeaseOut:
    """Lease a Ready, healthy proxy whose attributes match every selector pair, exclusively,
    until ``ttl_seconds`` pass or it is released. 503 ``no_proxy_available`` (with
    ``Retry-After``) when none is free."""
    granted = await api.leases.acquire(data.selector, data.ttl_seconds, data.holder)
    return _lease(api, granted)


@get("/leases/{lease_id:str}", tags=["leases"], responses=_errors(401, 404))
async def get_lease(api: Api, lease_id: FromPath[str]) -> LeaseOut:
    return _lease(api, api.leases.get(lease_id))


@delete("/leases/{lease_id:str}", tags=["leases"], status_code=200, responses=_errors(401, 404))
async def release(api: Api, lease_id: FromPath[str]) -> LeaseOut:
    """End the lease; the proxy cools down before its next lease. Idempotent: releasing an
    ended lease answers its state (``released`` or ``expired``) and changes nothing."""
    return _lease(api, await api.leases.release(lease_id))


@post(
    "/leases/{lease_id:str}/report",
    tags=["leases"],
    status_code=200,
    responses=_errors(400, 401, 404, 413),
)
async def report(api: Api, lease_id: FromPath[str], data: JSONBody[ReportRequest]) -> LeaseOut:
    """Record how the work through the proxy went (also after release)."""
    return _lease(api, await api.leases.report(lease_id, data.outcome, data.detail))


# ----------------------------------------------------------------------------------- app


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    ApiError: on_api_error,
    HTTPException: on_http_exception,
    Exception: on_unexpected,
}


def create_app(
    api: DiscoveryApi, *, token: str | None, max_body_size: int = MAX_BODY_BYTES
) -> Litestar:
    guards: list[Guard] = [bearer_guard(token)] if token else []
    v1 = Router(
        "/v1",
        route_handlers=[list_proxies, get_proxy, acquire, get_lease, release, report],
        guards=guards,
        security=[{"bearer": []}],
    )
    openapi = OpenAPIConfig(
        title="egress-proxies discovery API",
        version=API_VERSION,
        description=(
            "List egress proxies and lease them exclusively. Every error answers "
            '`{"error": code, "message": text}`. The `/v1` routes need '
            "`Authorization: Bearer <token>` when the server has DISCOVERY_TOKEN set."
        ),
        path="/schema",
        components=Components(
            security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")}
        ),
    )
    return Litestar(
        route_handlers=[healthz, metrics, v1],
        dependencies={"api": Provide(lambda: api, sync_to_thread=False)},
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=max_body_size,
        openapi_config=openapi,
        logging_config=None,
        debug=False,
    )
