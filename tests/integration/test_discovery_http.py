"""The discovery API's HTTP surface: one error shape, auth, the OpenAPI document, spans, metrics."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
from openapi_spec_validator import validate
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from services.discovery.service import DiscoveryService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.metrics import Metrics
from services.runtime.service import ServiceContext
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import Settings
from tests.support.discovery import discovery, ready_proxy

pytestmark = pytest.mark.integration

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
TOKEN = "s3cret-token"


@pytest.fixture
async def served(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> AsyncIterator[tuple[DiscoveryService, httpx.AsyncClient]]:
    await ready_proxy(jetstream_store, "p1", {"country": "de"})
    async with (
        discovery(nats_server.url, max_lease_ttl=60.0) as (service, base),
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        yield service, client


@pytest.fixture
def api(served: tuple[DiscoveryService, httpx.AsyncClient]) -> httpx.AsyncClient:
    return served[1]


async def test_every_error_has_one_shape(api: httpx.AsyncClient) -> None:
    cases: list[tuple[httpx.Response, int, str]] = [
        (await api.get("/nope"), 404, "not_found"),
        (await api.put("/v1/leases", json={}), 405, "method_not_allowed"),
        (await api.post("/v1/leases", content=b"x" * 100_000), 413, "body_too_large"),
        (await api.post("/v1/leases", content=b"{not json"), 400, "invalid_request"),
        (await api.post("/v1/leases", json={"colour": "red"}), 400, "invalid_request"),
        (await api.post("/v1/leases", json={"ttlSeconds": -1}), 400, "invalid_request"),
        (await api.get("/v1/proxies", params={"selector": "nokey"}), 400, "invalid_request"),
        (await api.get("/v1/leases/unknown"), 404, "unknown_lease"),
        (await api.delete("/v1/leases/unknown"), 404, "unknown_lease"),
        (await api.post("/v1/leases/unknown/report", json={"outcome": "failed"}), 404, ""),
        (await api.post("/v1/leases", json={"selector": {"country": "fr"}}), 422, ""),
        (await api.post("/v1/leases", json={"ttlSeconds": "60"}), 400, "invalid_request"),
    ]
    for response, status, code in cases:
        body = response.json()
        assert response.status_code == status, (response.request.url, body)
        assert set(body) == {"error", "message"}, body
        assert body["error"] == (code or {404: "unknown_lease", 422: "no_matching_proxy"}[status])
        assert body["message"]
        assert response.headers["content-type"].startswith("application/json")
    assert "ttlSeconds" in cases[5][0].json()["message"]
    assert "selector" in cases[6][0].json()["message"]
    assert "retry-after" not in cases[-2][0].headers  # nothing has the attributes: do not wait
    assert "ttlSeconds" in cases[-1][0].json()["message"]
    assert "65536 bytes at most" in cases[2][0].json()["message"]
    assert cases[1][0].json()["message"] == "PUT is not allowed on /v1/leases"


async def test_an_unexpected_failure_is_a_logged_500(
    served: tuple[DiscoveryService, httpx.AsyncClient],
    monkeypatch: pytest.MonkeyPatch,
    spans: InMemorySpanExporter,
) -> None:
    service, api = served
    assert service.api is not None

    async def boom(*args: object) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(service.api.leases, "acquire", boom)
    response = await api.post("/v1/leases", json={})
    assert response.status_code == 500
    assert response.json() == {
        "error": "internal",
        "message": "the request failed; the error is logged",
    }
    (span,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert span.name == "POST /v1/leases"
    assert span.status.status_code is StatusCode.ERROR


async def test_bearer_token(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    async with (
        discovery(nats_server.url, token=TOKEN) as (_, base),
        httpx.AsyncClient(base_url=base) as api,
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            denied = await api.get("/v1/proxies", headers=headers)
            assert denied.status_code == 401
            assert denied.json()["error"] == "unauthorized"
            assert denied.headers["www-authenticate"].startswith("Bearer")
        denied = await api.post("/v1/leases", json={})
        assert denied.status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert (await api.get("/v1/proxies", headers=auth)).status_code == 200
        assert (await api.post("/v1/leases", json={}, headers=auth)).status_code == 201
        for open_path in ("/healthz", "/metrics", "/schema/openapi.json"):
            assert (await api.get(open_path)).status_code == 200, open_path


async def test_openapi_document_is_valid(api: httpx.AsyncClient) -> None:
    response = await api.get("/schema/openapi.json")
    assert response.status_code == 200
    document = response.json()
    validate(document)
    assert {
        "/healthz",
        "/v1/proxies",
        "/v1/proxies/{uid}",
        "/v1/leases",
        "/v1/leases/{lease_id}",
        "/v1/leases/{lease_id}/report",
    } <= set(document["paths"])
    assert "/metrics" not in document["paths"]
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    acquire = document["paths"]["/v1/leases"]["post"]
    assert {"201", "400", "401", "409", "413", "422", "503"} <= set(acquire["responses"])
    assert "no_matching_proxy" in acquire["responses"]["422"]["description"]
    assert "Retry-After" in acquire["responses"]["503"]["description"]
    (key,) = [p for p in acquire["parameters"] if p["in"] == "header"]
    assert (key["name"], key["required"]) == ("Idempotency-Key", False)
    body = acquire["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    ttl = document["components"]["schemas"][body.rsplit("/", 1)[1]]["properties"]["ttlSeconds"]
    assert {"type": "number"} in ttl["oneOf"]
    assert (ttl["minimum"], ttl["maximum"]) == (1, 604800)
    lease = document["paths"]["/v1/leases/{lease_id}"]
    assert {"204", "404"} <= set(lease["delete"]["responses"])
    assert {"200", "400", "404", "503"} <= set(lease["patch"]["responses"])
    holders = document["paths"]["/v1/leases"]
    listed = {(p["name"], p["in"]) for p in holders["get"]["parameters"]}
    assert listed == {("holder", "query"), ("limit", "query"), ("continue", "query")}
    (holder,) = holders["delete"]["parameters"]
    assert (holder["name"], holder["in"]) == ("holder", "query")
    acquire_body = document["components"]["schemas"][body.rsplit("/", 1)[1]]["properties"]
    assert {"exclude", "proxyUid"} <= set(acquire_body)
    report = document["paths"]["/v1/leases/{lease_id}/report"]["post"]
    assert {"204", "400", "404"} <= set(report["responses"])
    schemas = document["components"]["schemas"]
    created = schemas[
        acquire["responses"]["201"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[
            1
        ]
    ]
    assert {"id", "proxy", "acquiredAt", "expiresAt", "fencingToken", "ttlClamped"} <= set(
        created["properties"]
    )
    query = {p["name"] for p in document["paths"]["/v1/proxies"]["get"]["parameters"]}
    assert {"phase", "healthy"} <= query


def _server_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]


async def test_server_spans_are_named_by_route_and_continue_the_callers_trace(
    api: httpx.AsyncClient, spans: InMemorySpanExporter
) -> None:
    assert (await api.get("/healthz")).status_code == 200
    assert (await api.get("/metrics")).status_code == 200
    assert _server_spans(spans) == []  # probes and scrapers are not traced

    got = await api.post("/v1/leases", json={}, headers={"traceparent": TRACEPARENT})
    assert got.status_code == 201
    lease_id = got.json()["id"]
    assert (await api.get(f"/v1/leases/{lease_id}")).status_code == 200
    assert (await api.get("/v1/nothing-here")).status_code == 404

    post, get, missing = _server_spans(spans)
    assert post.name == "POST /v1/leases"
    assert format(post.context.trace_id, "032x") == TRACE_ID
    assert post.parent is not None
    assert format(post.parent.span_id, "016x") == PARENT_ID
    assert post.attributes is not None
    assert post.attributes["http.route"] == "/v1/leases"
    assert post.attributes["http.response.status_code"] == 201
    assert get.name == "GET /v1/leases/{lease_id}"  # the template, never the id
    assert format(get.context.trace_id, "032x") != TRACE_ID  # no traceparent: a new trace
    assert missing.name == "GET"

    # The claim's append is a child of the request's span: one trace from client to log.
    publishes = [
        s
        for s in spans.get_finished_spans()
        if s.kind is SpanKind.PRODUCER and s.context.trace_id == post.context.trace_id
    ]
    assert publishes
    assert all(s.parent is not None for s in publishes)
    assert {s.parent.span_id for s in publishes if s.parent} == {post.context.span_id}


async def test_metrics_count_requests_and_leases(api: httpx.AsyncClient) -> None:
    assert (await api.post("/v1/leases", json={})).status_code == 201
    assert (await api.post("/v1/leases", json={})).status_code == 503
    text = (await api.get("/metrics")).text
    assert 'egress_lease_acquisitions_total{result="acquired"} 1.0' in text
    assert 'egress_lease_acquisitions_total{result="busy"} 1.0' in text
    assert 'egress_http_requests_total{method="POST",route="/v1/leases",status="201"} 1.0' in text
    assert "egress_http_request_seconds_bucket" in text


async def test_healthz(api: httpx.AsyncClient) -> None:
    response = await api.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_a_busy_port_is_a_clear_error(conn: Connection) -> None:
    ctx = ServiceContext(
        settings=Settings(),
        conn=conn,
        store=JetStreamEventStore(conn.nc, conn.js),
        metrics=Metrics(),
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        service = DiscoveryService(host="127.0.0.1", port=port)
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            await asyncio.wait_for(service.run(ctx), 10)
