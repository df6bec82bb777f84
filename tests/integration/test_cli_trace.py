"""A one-shot command is a trace: its root span is exported by the CLI process, and the discovery
API and the events it appends continue it. The CLI runs as its own process, so only the headers
can link the spans; the discovery replica runs in the test with its spans kept in memory."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from events import subjects
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy
from tests.support.system import base_env, cli
from tests.support.trace_roundtrip import OtlpReceiver
from tests.support.waiting import until

pytestmark = pytest.mark.integration

CLI_SERVICE = "egress-proxies-cli"


def manifest(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\n"
        f"metadata: {{name: {name}, namespace: traced}}\nspec:\n  provider: local\n"
    )
    return str(path)


async def run(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    done = await asyncio.to_thread(cli, *args, env=env, timeout=60)
    return done.returncode, done.stdout, done.stderr


def traced_env(receiver: OtlpReceiver, nats_url: str) -> dict[str, str]:
    return {**base_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "NATS_URL": nats_url}


async def test_a_lease_command_is_one_trace_with_the_api_request_it_made(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    spans: InMemorySpanExporter,
) -> None:
    await ready_proxy(jetstream_store, "p1")
    with OtlpReceiver() as receiver:
        async with discovery(nats_server.url) as (_, api):
            env = traced_env(receiver, nats_server.url)
            code, out, err = await run(
                "lease", "acquire", "--api-url", api, "--ttl", "60", "-o", "json", env=env
            )
            assert code == 0, err
            assert json.loads(out)["proxy"]["uid"] == "p1"  # standard output is the answer alone
            missing = await run("lease", "release", "--api-url", api, "not-a-lease", env=env)
            assert missing[0] == 7, missing
        await until(lambda: len(receiver.spans()) >= 2, timeout=10, what="the CLI's spans")
    roots = {span.name: span for service, span in receiver.spans() if service == CLI_SERVICE}
    assert set(roots) == {"egress-proxies lease acquire", "egress-proxies lease release"}
    acquire, release = roots["egress-proxies lease acquire"], roots["egress-proxies lease release"]
    assert acquire.parent_span_id == b""
    ok = {a.key: a.value for a in acquire.attributes}
    assert ok["cli.command"].string_value == "lease acquire"
    assert ok["process.exit.code"].int_value == 0
    failed = {a.key: a.value for a in release.attributes}
    assert failed["process.exit.code"].int_value == 7
    assert release.status.code == release.status.STATUS_CODE_ERROR

    served = {
        s.name: s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER and s.parent
    }
    server = served["POST /v1/leases"]
    assert server.parent is not None
    assert server.context.trace_id.to_bytes(16, "big") == acquire.trace_id
    assert server.parent.span_id.to_bytes(8, "big") == acquire.span_id
    gone = served["DELETE /v1/leases/{lease_id}"]
    assert gone.context.trace_id.to_bytes(16, "big") == release.trace_id


async def test_apply_carries_its_trace_into_the_event_it_appends(
    tmp_path: Path, nats_server: EmbeddedNatsServer, conn: Connection
) -> None:
    with OtlpReceiver() as receiver:
        env = traced_env(receiver, nats_server.url)
        code, _, err = await run("apply", "-f", manifest(tmp_path, "traced"), env=env)
        assert code == 0, err
        await until(lambda: bool(receiver.spans()), timeout=10, what="the apply span")
    (service, root), *_ = [x for x in receiver.spans() if x[1].name == "egress-proxies apply"]
    assert service == CLI_SERVICE
    declared = await conn.js.get_msg(subjects.PROXY_STREAM, 1)
    traceparent = (declared.headers or {}).get("traceparent", "")
    assert traceparent.split("-")[1] == root.trace_id.hex(), declared.headers


async def test_without_tracing_configured_nothing_is_exported_or_printed(
    nats_server: EmbeddedNatsServer, conn: Connection, tmp_path: Path
) -> None:
    env = {**base_env(), "NATS_URL": nats_server.url}
    code, out, err = await run("apply", "-f", manifest(tmp_path, "plain"), env=env)
    assert code == 0, err
    assert "tracing" not in err
    assert "traceId" not in out + err
