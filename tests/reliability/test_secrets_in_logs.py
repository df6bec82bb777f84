"""Secrets stay out of logs, in both formats.

A real discovery service runs as its own process with ``DISCOVERY_TOKEN`` set and a NATS URL that
carries its password. The LEASE stream is then limited to messages smaller than any lease, so
JetStream refuses the next lease for real, and the service logs that unexpected failure (a 500)
with its traceback. Neither the token nor the password may appear in any line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from events.subjects import LEASE_STREAM
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.ports import free_port
from tests.support.clirun import cli, restore_logging_after
from tests.support.discovery import ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.reliability


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    yield from restore_logging_after()


ROOT = Path(__file__).resolve().parents[2]
TOKEN = "Tok3n-that.must_never~be-logged"


async def healthy(api: httpx.AsyncClient, process: asyncio.subprocess.Process) -> None:
    async def serving() -> bool:
        assert process.returncode is None, "the discovery service exited while starting"
        try:
            return (await api.get("/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    await until(serving, timeout=30, every=0.1, what="discovery answering /healthz")


@pytest.mark.parametrize("log_format", ["console", "json"])
async def test_a_failed_request_logs_neither_the_token_nor_the_nats_password(
    tmp_path: Path,
    nats_server: EmbeddedNatsServer,
    conn: Connection,
    jetstream_store: JetStreamEventStore,
    log_format: str,
) -> None:
    await ready_proxy(jetstream_store, "p1")
    port = free_port("127.0.0.1")
    login = nats_server.credentials_for("discovery")
    url = nats_server.url.replace("nats://", f"nats://{login.user}:{login.password}@")
    env = os.environ | {
        "DISCOVERY_TOKEN": TOKEN,
        "LOG_FORMAT": log_format,
        "LOG_LEVEL": "debug",
        "OTEL_SDK_DISABLED": "true",
        "COLUMNS": "80",
    }
    logged = tmp_path / "discovery.log"
    with logged.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.cli.main", "run", "discovery",
            "--nats-url", url, "--port", str(port), "--metrics-port", "0",
            stdout=out, stderr=out, env=env, cwd=ROOT,
        )  # fmt: skip
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers=auth, timeout=60
        ) as api:
            await healthy(api, process)
            assert (await api.get("/v1/proxies")).status_code == 200
            lease_stream = (await conn.js.stream_info(LEASE_STREAM)).config
            lease_stream.max_msg_size = 16
            await conn.js.update_stream(lease_stream)
            failed = await api.post("/v1/leases", json={"holder": "crawler"})
            assert failed.status_code == 500, failed.text
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    text = logged.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    if log_format == "json":
        records = [json.loads(line) for line in lines]
        (failure,) = [r for r in records if r["event"] == "request failed"]
        assert "Traceback" in failure["exception"]
        assert "EventStoreError" in failure["exception"]
    else:
        assert any("request failed" in line for line in lines)
        assert "Traceback (most recent call last)" in text
        assert "EventStoreError" in text
    address = nats_server.url.removeprefix("nats://")
    assert any(address in line for line in lines), "no line named the NATS URL"
    for line in lines:
        assert TOKEN not in line
        assert login.password not in line


async def test_an_error_quoting_a_nats_url_leaves_its_password_out() -> None:
    """Standard error is a service's log as well: the one line a failure ends with is scrubbed."""
    password = "Passw0rd-in-the-url"
    result = await cli("streams", "info", "--nats-url", f"nats://egress:{password}@127.0.0.1:1")
    assert result.exit_code == 3, result.output
    assert "127.0.0.1:1" in result.stderr
    assert password not in result.output
