"""One trace across two processes: publish → process → publish, as a collector receives it.

docs/architecture.md (Telemetry) promises that trace context crosses every NATS hop in
headers. Only separate processes prove it: inside one process the current span would link the
spans even if no header carried it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto

from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.trace_roundtrip import CONSUMER, PUBLISHER, OtlpReceiver
from tests.support.waiting import until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Run:
    stdout: str
    stderr: str

    def json_lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.stderr.splitlines() if line.startswith("{")]


async def run_role(role: str, url: str, endpoint: str, *extra: str) -> Run:
    # Only the variables under test: an OTEL_* setting of the machine running the tests must
    # not change what the processes export.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.trace_roundtrip",
        role,
        "--nats-url",
        url,
        "--uid",
        "traced-1",
        *extra,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), 60)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    run = Run(out.decode(), err.decode())
    assert process.returncode == 0, f"{role} exited with {process.returncode}:\n{run.stderr}"
    return run


def hexid(raw: bytes) -> str:
    return raw.hex()


async def wait_for_spans(receiver: OtlpReceiver, count: int) -> list[tuple[str, SpanProto]]:
    # Each process flushes on exit, so the spans are normally there already; the wait only
    # absorbs a slow export thread.
    await until(lambda: len(receiver.spans()) >= count, timeout=5, what=f"{count} spans")
    return receiver.spans()


async def test_one_trace_spans_publisher_and_consumer_processes(
    nats_server: EmbeddedNatsServer, conn: Connection
) -> None:
    with OtlpReceiver() as receiver:
        published = await run_role("publish", nats_server.url, receiver.endpoint)
        consumed = await run_role(
            "consume", nats_server.url, receiver.endpoint, "--durable", "traced"
        )
        spans = await wait_for_spans(receiver, 4)

    assert {e.path for e in receiver.exports} == {"/v1/traces"}
    by_process: dict[str, dict[str, SpanProto]] = {PUBLISHER: {}, CONSUMER: {}}
    for service, span in spans:
        assert span.name not in by_process[service], f"{service} sent {span.name} twice"
        by_process[service][span.name] = span
    assert sorted(by_process[PUBLISHER]) == ["cli.apply", "publish PROXY"]
    assert sorted(by_process[CONSUMER]) == ["process traced", "publish PROXY"]

    apply = by_process[PUBLISHER]["cli.apply"]
    sent = by_process[PUBLISHER]["publish PROXY"]
    process = by_process[CONSUMER]["process traced"]
    effect = by_process[CONSUMER]["publish PROXY"]

    trace_id = published.stdout.strip()
    assert len(trace_id) == 32
    assert {hexid(span.trace_id) for _, span in spans} == {trace_id}

    assert apply.parent_span_id == b""
    assert sent.parent_span_id == apply.span_id
    assert process.parent_span_id == sent.span_id
    assert effect.parent_span_id == process.span_id

    assert apply.kind == SpanProto.SPAN_KIND_INTERNAL
    assert sent.kind == SpanProto.SPAN_KIND_PRODUCER
    assert process.kind == SpanProto.SPAN_KIND_CONSUMER
    assert effect.kind == SpanProto.SPAN_KIND_PRODUCER

    # The consumer's log line written inside the handler names the very span it ran in.
    handled = [line for line in consumed.json_lines() if line.get("event") == "handled"]
    assert len(handled) == 1, consumed.stderr
    assert handled[0]["traceID"] == trace_id
    assert handled[0]["spanID"] == hexid(process.span_id) == handled[0]["span"]

    # The consumer acknowledged before it exited: the trace is of a completed delivery.
    info = await conn.js.consumer_info("PROXY", "traced")
    assert (info.num_ack_pending, info.num_pending) == (0, 0)

    # Both processes announced their tracing state once, with the endpoint they used.
    for run in (published, consumed):
        states = [line for line in run.json_lines() if line.get("logger") == "egress.telemetry"]
        assert len(states) == 1, run.stderr
        assert states[0]["enabled"] is True
        assert states[0]["endpoint"] == f"{receiver.endpoint}/v1/traces"
