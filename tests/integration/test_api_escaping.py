"""No answer of a real discovery replica puts what a request sent into HTML unescaped.

Every route of the app's own route table (the API, the console, the schema pages) is called with
markup in each path parameter, each query parameter and the body; an answer that is not JSON
must not contain the markup as sent. A JSON body may quote it (a browser does not render
``application/json``), but must then be JSON (docs/decisions/0095-the-console-and-the-api-bound.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, get_args
from urllib.parse import quote

import httpx
import pytest
from litestar import Litestar

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy

pytestmark = pytest.mark.integration

PAYLOADS = (
    "<b>x</b>",
    '<script>alert("x")</script>',
    '<meta http-equiv="refresh" content="0;url=https://example.invalid/">',
    '"><svg onload=alert(1)>',
)
RAW_QUERY = (
    "at",
    "phase",
    "health",
    "healthy",
    "provider",
    "attrs",
    "attr.country",
    "egress_country",
    "egress.country",
    "egress.asn",
    "next",
    "limit",
    "continue",
    "q",
    "sort",
    "order",
    "page",
    "size",
    "since",
)
"""Names some handlers read from the raw query instead of declaring them (the console's filters
and its time, the login's target): sent to every route with the names its handler declares."""
SKIPPED_METHODS = frozenset({"OPTIONS", "HEAD"})
PATH_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


def _declared_query(handler: Any, path_params: Any) -> list[str]:
    """The handler's own parameters that come from the query: plain strings, not the path's."""
    names = []
    for name, parsed in handler.parsed_fn_signature.parameters.items():
        if name in path_params or name in {"data", "request", "scope"}:
            continue
        if parsed.annotation is str or str in get_args(parsed.annotation):
            names.append(name)
    return names


def requests(app: Litestar, payload: str) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(method, path, query) for every handler of every route: ``payload`` in all its path
    parameters, then in each query parameter on its own (so that an earlier refusal cannot
    hide a later echo), then as a query parameter's name."""
    for route in app.routes:
        marked = PATH_PARAM.sub(lambda _: quote(payload, safe=""), route.path)
        plain = PATH_PARAM.sub("p1", route.path)
        for handler in getattr(route, "route_handlers", ()):
            names = dict.fromkeys([*_declared_query(handler, route.path_parameters), *RAW_QUERY])
            for method in sorted(set(handler.http_methods) - SKIPPED_METHODS):
                if marked != plain:
                    yield method, marked, {}
                for name in names:
                    yield method, plain, {name: payload}
                yield method, plain, {payload: "1"}


def _bodies(payload: str) -> list[dict[str, Any]]:
    as_json = {
        "selector": {payload: payload},
        "holder": payload,
        "target": payload,
        "outcome": payload,
        "detail": payload,
        "ttlSeconds": payload,
    }
    form = {"next": payload, "token": payload}
    return [
        {"json": as_json},
        {"content": str(httpx.QueryParams(form)), "headers": _FORM},
        {"content": payload.encode(), "headers": {"content-type": "text/html"}},
    ]


_FORM = {"content-type": "application/x-www-form-urlencoded"}


def check(response: httpx.Response, payload: str) -> None:
    where = f"{response.request.method} {response.request.url} -> {response.status_code}"
    kind = response.headers.get("content-type", "")
    if "json" in kind:
        json.loads(response.content)  # JSON-encoded, whatever it quotes
        return
    assert payload not in response.text, f"{where} ({kind}) echoes the markup raw"


async def test_no_route_answers_markup_it_was_sent_unescaped(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1", {"country": "de"})
    async with (
        discovery(nats_server.url) as (service, base),
        httpx.AsyncClient(base_url=base, timeout=20) as client,
    ):
        assert service.app is not None
        sent = 0
        for payload in PAYLOADS:
            for method, path, params in requests(service.app, payload):
                variants = _bodies(payload) if method in {"POST", "PATCH", "PUT"} else [{}]
                for extra in variants:
                    response = await client.request(method, path, params=params, **extra)
                    check(response, payload)
                    sent += 1
        # The route table, not a hand list: the console's parts and the API are all in it.
        paths = {route.path for route in service.app.routes}
        assert {
            "/ui/live",
            "/ui/proxies/{uid:str}/live",
            "/ui/clients/{name:str}",
            "/v1/proxies/{uid:str}",
        } <= paths
        assert sent > 500
