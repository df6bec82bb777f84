"""The executor's start-up check (`up` and `run executor`): each entry's preflight runs in the
background, its failing findings are logged with their fixes, and neither a failing nor a slow
one keeps the executor from answering commands
(docs/decisions/0144-the-preflight-command-and-the-start-up-check.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from events.schemas import InstanceCreated
from services.executor.service import ExecutorService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.observability.metrics import Metrics
from services.runtime.service import ServiceContext
from services.runtime.settings.shared import Settings
from tests.support.executor_harness import FAST, answered, create, declare, send
from tests.support.waiting import until

pytestmark = pytest.mark.integration

CONFIG = """\
providers:
  - name: fake
    type: fake
    fake:
      preflight:
        delay: 600
        findings: [{check: credentials, ok: true}]
  - name: cloud
    type: fake
    fake:
      preflight:
        findings:
          - {check: credentials, ok: true, detail: token accepted}
          - check: size in nyc1
            ok: false
            detail: s-1vcpu-512mb-10gb is not offered in nyc1
            fix: use a region where it is offered, e.g. ams3
"""


async def test_a_failing_preflight_is_logged_and_a_slow_one_delays_nothing(
    conn: Connection, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    config = tmp_path / "providers.yaml"
    config.write_text(CONFIG)
    ctx = ServiceContext(settings=Settings(), conn=conn, store=jetstream_store, metrics=Metrics())
    service = ExecutorService(config, tmp_path, observe_interval=0.05, policy=FAST)
    with capture_logs() as logs:
        task = asyncio.create_task(service.run(ctx))
        try:
            await declare(jetstream_store, "s1")
            await send(jetstream_store, "s1", create())
            # Answered while the entry's own preflight still waits on its (slow) cloud.
            await answered(jetstream_store, "s1", InstanceCreated)

            def warned() -> bool:
                return any(e["event"] == "preflight: this provider entry would fail" for e in logs)

            await until(warned)
            assert not any(e.get("provider") == "fake" and "preflight" in e["event"] for e in logs)
        finally:
            task.cancel()
            # Stopping does not wait for the slow preflight either.
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)
    [warning] = [e for e in logs if e["event"] == "preflight: this provider entry would fail"]
    assert warning["log_level"] == "warning"
    assert (warning["provider"], warning["check"]) == ("cloud", "size in nyc1")
    assert warning["detail"] == "s-1vcpu-512mb-10gb is not offered in nyc1"
    assert warning["fix"] == "use a region where it is offered, e.g. ams3"
