"""Two processes of one trace, and the collector that receives their spans.

``publish`` plays the CLI: it opens ``cli.apply`` and appends one health event. ``consume`` plays a
service: its durable consumer handles that event and, inside the handler, appends a status event.
Each role configures tracing from its environment like a real service, so a test that points both
at ``OtlpReceiver`` sees exactly what a collector would.

Usage::

    python -m tests.support.trace_roundtrip publish --nats-url URL --uid UID
    python -m tests.support.trace_roundtrip consume --nats-url URL --uid UID [--durable NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import structlog
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto

from events import subjects
from events.schemas import HealthChanged, Phase, PhaseChanged
from events.store import NewEvent, derive_msg_id
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import connect
from services.runtime.nats.consumer import ConsumerLoop, ConsumerSpec, Delivery, Outcome
from services.runtime.observability.logs import configure_logging
from services.runtime.observability.metrics import Metrics
from services.runtime.observability.telemetry import configure_tracing, shutdown_tracing, tracer

PUBLISHER = "roundtrip-cli"
CONSUMER = "roundtrip-worker"

log = structlog.get_logger("egress.roundtrip")

# ------------------------------------------------------------------------------- receiver


@dataclass(frozen=True, slots=True)
class Export:
    path: str
    content_type: str
    request: ExportTraceServiceRequest


class OtlpReceiver:
    """A real OTLP/HTTP endpoint on 127.0.0.1 that keeps every export it is sent.

    A thread with ``http.server``, not the test's event loop: the exporters post synchronously
    from their own threads, and the receiver must answer even while a test blocks.
    """

    def __init__(self) -> None:
        self.exports: list[Export] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.record(Export(self.path, self.headers.get("Content-Type", ""), request))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                """Quiet: the test reports what it received, not each request."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def record(self, export: Export) -> None:
        with self._lock:
            self.exports.append(export)

    def spans(self) -> list[tuple[str, SpanProto]]:
        """Every received span with its resource's ``service.name``."""
        with self._lock:
            exports = list(self.exports)
        out: list[tuple[str, SpanProto]] = []
        for export in exports:
            for resource_spans in export.request.resource_spans:
                service = next(
                    (
                        a.value.string_value
                        for a in resource_spans.resource.attributes
                        if a.key == "service.name"
                    ),
                    "",
                )
                for scope_spans in resource_spans.scope_spans:
                    out.extend((service, span) for span in scope_spans.spans)
        return out

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# ---------------------------------------------------------------------------------- roles


async def publish(url: str, uid: str) -> None:
    conn = await connect(url, name=PUBLISHER)
    try:
        store = JetStreamEventStore(conn.nc, conn.js)
        with tracer("egress.cli").start_as_current_span("cli.apply") as span:
            await store.append(
                subjects.proxy(uid),
                [NewEvent(HealthChanged(healthy=True, reason="roundtrip"), f"roundtrip-{uid}")],
            )
            log.info("published", uid=uid)
            print(format(span.get_span_context().trace_id, "032x"), flush=True)
    finally:
        await conn.close()


async def consume(url: str, uid: str, durable: str) -> None:
    conn = await connect(url, name=CONSUMER)
    store = JetStreamEventStore(conn.nc, conn.js)
    handled = asyncio.Event()

    async def handle(delivery: Delivery) -> Outcome:
        cause = delivery.recorded.msg_id
        await store.append(
            subjects.proxy(uid),
            [NewEvent(PhaseChanged(phase=Phase.READY), derive_msg_id("roundtrip", cause), cause)],
        )
        span = trace.get_current_span().get_span_context()
        log.info("handled", subject=delivery.recorded.subject, span=format(span.span_id, "016x"))
        handled.set()
        return None

    spec = ConsumerSpec(
        stream=subjects.PROXY_STREAM,
        durable=durable,
        filter_subjects=(f"proxy.{uid}.health",),
        fetch_timeout=0.2,
    )
    loop = ConsumerLoop(conn, spec, handle, store=store, metrics=Metrics())
    try:
        await loop.ensure()
        while not handled.is_set():
            await loop.step()
        await loop.drain()
    finally:
        # Close, not drain: nats-py's pull fetch takes queued messages without marking them done,
        # so draining its subscription waits out the whole drain timeout (30 s). The acks were
        # written before; the flush delivers them.
        await conn.nc.flush()
        await conn.nc.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.trace_roundtrip")
    parser.add_argument("role", choices=("publish", "consume"))
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--uid", default="roundtrip")
    parser.add_argument("--durable", default="roundtrip")
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    configure_logging("info", "json")
    configure_tracing(PUBLISHER if args.role == "publish" else CONSUMER)
    try:
        if args.role == "publish":
            asyncio.run(publish(args.nats_url, args.uid))
        else:
            asyncio.run(
                asyncio.wait_for(consume(args.nats_url, args.uid, args.durable), args.timeout)
            )
    finally:
        shutdown_tracing()
    return 0


if __name__ == "__main__":
    sys.exit(main())
