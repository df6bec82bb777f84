"""Who is calling, and what of theirs they may touch (docs/api.md, "Clients"; D96).

The clients come from ``services.runtime.clients`` (the clients file, re-read while the service
runs, plus ``DISCOVERY_TOKEN``'s admin client). The ``/v1`` guard identifies the caller from
its bearer token, checks the scope the route asks for (``opt={"scope": ...}``) and leaves the
``Client`` on the connection for the handlers, which check that a lease is the caller's own.
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard
from prometheus_client import CollectorRegistry, Counter

from projections.lease import LeaseRecord
from services.discovery.http.errors import ApiError
from services.discovery.pure.errorcodes import ErrorCode
from services.runtime.clients import Clients
from services.runtime.observability.metrics import metric_set
from services.runtime.pure.clients import OPEN, Client

CLIENTS_ENV = "DISCOVERY_CLIENTS_FILE"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="egress-proxies"'}
STATE_KEY = "egress_client"


class Forbidden(ApiError):
    """The caller is known, but this is not theirs to do."""

    code = ErrorCode.FORBIDDEN


class NotYourLease(ApiError):
    code = ErrorCode.NOT_YOUR_LEASE


class LeaseLimit(ApiError):
    code = ErrorCode.LEASE_LIMIT


class AccessMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.refusals = Counter(
            "egress_api_refusals_total",
            "Requests refused for who sent them, by reason (unauthorized, scope, not_your_lease, "
            "selector, lease_limit, login_throttled)",
            ["reason"],
            registry=registry,
        )
        self.file_errors = Counter(
            "egress_api_clients_file_errors_total",
            "Re-reads of the clients file that failed (the table in use stays as it was)",
            registry=registry,
        )


def access_metrics(registry: CollectorRegistry) -> AccessMetrics:
    return metric_set(registry, AccessMetrics)


def guard(clients: Clients, metrics: AccessMetrics) -> Guard:
    """The ``/v1`` guard over ``clients``; a re-read of the clients file that fails is counted
    in ``metrics`` from now on."""
    clients.file_error = metrics.file_errors.inc

    async def identify(
        connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
    ) -> None:
        # A coroutine: Litestar runs a plain function guard in its thread pool, a thread hop
        # that cost a fifth of the API's CPU per lease cycle (docs/benchmarks.md, Discovery API).
        client = OPEN if clients.open else _bearer(clients, connection, metrics)
        scope = handler.opt.get("scope")
        if scope is not None and not client.may(scope):
            metrics.refusals.labels("scope").inc()
            raise Forbidden(
                f"client {client.name!r} may not do this: it needs the {scope!r} scope "
                "(the clients file lists each client's scopes)"
            )
        connection.state[STATE_KEY] = client

    return identify


def _bearer(
    clients: Clients, connection: ASGIConnection[Any, Any, Any, Any], metrics: AccessMetrics
) -> Client:
    scheme, _sep, given = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        metrics.refusals.labels("unauthorized").inc()
        raise NotAuthorizedException(
            "this API needs `Authorization: Bearer <token>`", headers=CHALLENGE
        )
    client = clients.identify(given.strip())
    if client is None:
        metrics.refusals.labels("unauthorized").inc()
        raise NotAuthorizedException("the bearer token is not valid", headers=CHALLENGE)
    return client


def caller(connection: ASGIConnection[Any, Any, Any, Any]) -> Client:
    """The client the guard identified (``OPEN`` on a route without the guard)."""
    client = connection.state.get(STATE_KEY)
    return client if isinstance(client, Client) else OPEN


def check_owner(client: Client, record: LeaseRecord, metrics: AccessMetrics | None) -> None:
    """Refuse a lease that is not ``client``'s: 403, naming neither the owner nor the holder."""
    if client.owns(record.client):
        return
    if metrics is not None:
        metrics.refusals.labels("not_your_lease").inc()
    raise NotYourLease(
        f"lease {record.lease_id} was acquired by another client; a client may use only the "
        "leases it acquired (an admin client may use any)"
    )


def check_acquire(client: Client, selector: dict[str, str], metrics: AccessMetrics | None) -> None:
    """The client's allowed selectors; its ``maxLeases`` is held by ``quota`` while a lease
    is granted (D135)."""
    if not client.allows_selector(selector):
        if metrics is not None:
            metrics.refusals.labels("selector").inc()
        allowed = ", ".join(str(dict(s)) for s in client.selectors)
        raise Forbidden(
            f"selector: client {client.name!r} may lease only with one of these selectors "
            f"(or narrower): {allowed}"
        )
