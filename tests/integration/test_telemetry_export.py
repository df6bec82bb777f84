"""Spans exported over the wire to a real OTLP endpoint on loopback: HTTP and gRPC.

The tracing gate and what each setting installs, without a server, are in
tests/unit/test_telemetry.py.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc  # type: ignore[import-untyped]  # grpcio ships no type information
import pytest
import structlog
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from services.runtime.observability.logs import configure_logging
from services.runtime.observability.telemetry import (
    configure_tracing,
    reset_for_tests,
    shutdown_tracing,
    tracer,
)
from tests.support.trace_roundtrip import OtlpReceiver

pytestmark = pytest.mark.integration

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"


@pytest.fixture(autouse=True)
def quiet_and_reset() -> Iterator[None]:
    """Log lines go to a buffer; the tracing set-up and logging are put back afterwards."""
    root = logging.getLogger()
    handlers, level, config = list(root.handlers), root.level, structlog.get_config()
    configure_logging("info", "json", io.StringIO())
    try:
        yield
    finally:
        reset_for_tests()
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**config)


def test_otlp_http_exports_to_the_traces_path_and_shutdown_flushes() -> None:
    with OtlpReceiver() as receiver:
        state = configure_tracing("executor", {ENDPOINT: receiver.endpoint})
        assert (state.exporter, state.endpoint) == ("otlp/http", f"{receiver.endpoint}/v1/traces")
        with tracer("tests").start_as_current_span("provider.create", kind=trace.SpanKind.CLIENT):
            pass
        # The batch processor would wait seconds; shutting down must not lose the span.
        shutdown_tracing()
        shutdown_tracing()
        spans = receiver.spans()
    assert [(service, span.name) for service, span in spans] == [("executor", "provider.create")]
    assert receiver.exports[0].path == "/v1/traces"
    assert receiver.exports[0].content_type == "application/x-protobuf"


class _Collector:
    """A gRPC TraceService that keeps what it is sent."""

    def __init__(self) -> None:
        self.received: list[ExportTraceServiceRequest] = []
        self.lock = threading.Lock()

    def Export(
        self, request: ExportTraceServiceRequest, context: Any
    ) -> ExportTraceServiceResponse:
        with self.lock:
            self.received.append(request)
        return ExportTraceServiceResponse()


def test_otlp_grpc_exports_over_grpc() -> None:
    collector = _Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)  # type: ignore[no-untyped-call]  # generated code is unannotated
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        env = {ENDPOINT: f"http://127.0.0.1:{port}", PROTOCOL: "grpc"}
        assert configure_tracing("gc", env).exporter == "otlp/grpc"
        with tracer("tests").start_as_current_span("gc.sweep"):
            pass
        shutdown_tracing()
    finally:
        server.stop(grace=None).wait()
    names = [
        span.name
        for request in collector.received
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]
    assert names == ["gc.sweep"]
