"""Nothing internal leaks through a proxy: probe requests carry Host, User-Agent, Connection and
nothing else, inside an active trace and with probe spans on; https goes through CONNECT + TLS."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.health.probe_client import USER_AGENT, CheckUrl, ProbeClient
from services.health.service import HealthService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.telemetry import tracer
from tests.support.health import (
    RecordingTarget,
    Squid,
    declare_ready,
    fast_check,
    health_events,
    start_replica,
)
from tests.support.loopback import listening, localhost_tls
from tests.support.waiting import until

pytestmark = pytest.mark.integration

ALLOWED = {"host", "user-agent", "connection"}


def leaked(headers: dict[str, str]) -> set[str]:
    internal = ("traceparent", "tracestate", "baggage", "egress-", "nats-")
    return {name for name in headers if name.startswith(internal)}


async def test_a_probe_in_an_active_trace_sends_exactly_three_headers(
    spans: InMemorySpanExporter, target: RecordingTarget
) -> None:
    client = ProbeClient()
    # The origin answers absolute-URI requests, so it can stand in for the proxy: what it
    # records is exactly what the prober wrote, before any proxy rewrites it.
    proxy_url = f"http://127.0.0.1:{target.port}"
    with tracer("tests").start_as_current_span("caller") as caller:
        assert caller.get_span_context().is_valid
        for _ in range(3):
            result = await client.probe(proxy_url, CheckUrl.parse(target.url()), 2.0)
            assert result.ok, result
    await client.close()
    assert len(target.requests) == 3
    for line, headers in target.requests:
        assert line == f"GET {target.url()} HTTP/1.1"
        assert set(headers) == ALLOWED
        assert headers["user-agent"] == USER_AGENT


async def test_probes_through_squid_leak_no_trace_headers_and_emit_client_spans(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    spans: InMemorySpanExporter,
    squid: Squid,
    target: RecordingTarget,
) -> None:
    await declare_ready(jetstream_store, "h1", squid.url, fast_check(target.url()))
    service = HealthService(
        check_url=target.url(), heartbeat=0.2, replica_id="traced", trace_probes=True
    )
    with tracer("tests").start_as_current_span("operator"):
        replica = await start_replica(nats_server.url, service)
    try:

        async def probed() -> bool:
            return len(target.requests) >= 5 and bool(await health_events(jetstream_store, "h1"))

        await until(probed)
    finally:
        await replica.stop()
    for _, headers in target.requests:
        assert not leaked(headers), headers
        assert headers["user-agent"] == USER_AGENT
    probes = [s for s in spans.get_finished_spans() if s.name == "health.probe"]
    assert len(probes) >= 5
    for span in probes:
        assert span.kind is trace.SpanKind.CLIENT
        assert span.parent is None, "a probe span is a root: the clock caused it"
        assert span.attributes is not None
        assert span.attributes["proxy.uid"] == "h1"
        assert span.attributes["health.result"] == "ok"


async def test_no_probe_spans_unless_asked(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    spans: InMemorySpanExporter,
    target: RecordingTarget,
) -> None:
    proxy_url = f"http://127.0.0.1:{target.port}"
    await declare_ready(jetstream_store, "h2", proxy_url, fast_check(target.url()))
    replica = await start_replica(
        nats_server.url, HealthService(check_url=target.url(), heartbeat=0.2, replica_id="quiet")
    )
    try:
        await until(lambda: _at_least(target, 5))
    finally:
        await replica.stop()
    assert not [s for s in spans.get_finished_spans() if s.name == "health.probe"]


async def _at_least(target: RecordingTarget, n: int) -> bool:
    return len(target.requests) >= n


async def test_https_check_goes_through_a_connect_tunnel(squid: Squid) -> None:
    server_ctx, client_ctx = localhost_tls()
    seen: list[dict[str, str]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
                pairs = (line.partition(":") for line in head[1:] if line)
                seen.append({k.strip().lower(): v.strip() for k, _, v in pairs})
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        finally:
            writer.close()

    client = ProbeClient(ssl_context=client_ctx)
    try:
        async with listening(serve, tls=server_ctx) as port:
            check = CheckUrl.parse(f"https://localhost:{port}/tls")
            results = [await client.probe(squid.url, check, 5.0) for _ in range(3)]
    finally:
        await client.close()
    assert [r.outcome for r in results] == ["ok"] * 3, results
    assert len(seen) == 3
    assert all(set(headers) == ALLOWED for headers in seen)
