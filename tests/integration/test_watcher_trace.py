"""A Proxy applied to the cluster is one trace: the watcher's declaration, the reconciler and
executor, and the status patches that show the outcome."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.waiting import until
from tests.support.watcher_harness import bench

pytestmark = pytest.mark.integration


async def test_status_patches_continue_the_trace_of_the_declaration(
    tmp_path: Path,
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    spans: InMemorySpanExporter,
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        await b.watcher()
        uid = b.create("de-1")

        async def ready() -> bool:
            return b.status("de-1").get("phase") == "Ready"

        await until(ready)

        def patched_ready() -> bool:
            return any(
                s.name == "status.patch" and (s.attributes or {}).get("proxy.phase") == "Ready"
                for s in spans.get_finished_spans()
            )

        async def exported() -> bool:
            return patched_ready()

        await until(exported)
    finished = spans.get_finished_spans()
    [declare] = [
        s
        for s in finished
        if s.name == "watcher.declare" and (s.attributes or {}).get("proxy.uid") == uid
    ]
    assert declare.parent is None  # the root: a kubectl apply starts here
    trace_id = declare.context.trace_id
    patches = [s for s in finished if s.name == "status.patch"]
    ready_patch = [s for s in patches if (s.attributes or {}).get("proxy.phase") == "Ready"]
    assert ready_patch
    assert all(s.context.trace_id == trace_id for s in ready_patch)
    assert all(s.parent is not None for s in patches)
    in_trace = {s.name for s in finished if s.context.trace_id == trace_id}
    assert "Reconcile Proxy" in in_trace
    assert any(name.startswith("provider.") for name in in_trace)
    # The status patch's API call is a client span under it; the watch itself makes none.
    patch_ids = {s.context.span_id for s in ready_patch}
    assert any(s.parent is not None and s.parent.span_id in patch_ids for s in finished)
    roots = [s for s in finished if s.parent is None]
    assert not [s for s in roots if s.name.startswith(("GET ", "PATCH ", "PUT ", "POST "))]
