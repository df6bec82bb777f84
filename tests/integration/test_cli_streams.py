"""``streams init`` and ``streams info`` against a real nats-server.

Commands run in-process through click's runner (tests/support/clirun.py).
"""

from __future__ import annotations

import pytest
from nats.js.api import StreamConfig

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import STREAMS
from services.runtime.nats.connection import connect
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.cli_seed import seed_proxy
from tests.support.clirun import cli, restore_logging_after

pytestmark = pytest.mark.integration


restore_logging = pytest.fixture(autouse=True)(restore_logging_after)


async def test_streams_init_creates_then_reports_existing(
    nats_server: EmbeddedNatsServer,
) -> None:
    first = await cli("streams", "init", "--nats-url", nats_server.url)
    assert first.exit_code == 0, first.output
    for spec in STREAMS:
        assert f"{spec.name}: created" in first.stdout
    second = await cli("streams", "init", "--nats-url", nats_server.url)
    assert second.exit_code == 0, second.output
    for spec in STREAMS:
        assert f"{spec.name}: exists" in second.stdout
    assert "created" not in second.stdout


async def test_streams_init_refuses_a_stream_configured_differently(
    nats_server: EmbeddedNatsServer,
) -> None:
    conn = await connect(nats_server.url)
    try:
        await conn.js.add_stream(StreamConfig(name="PROXY", subjects=["proxy.*.*"], max_age=60))
    finally:
        await conn.close()
    result = await cli("streams", "init", "--nats-url", nats_server.url)
    assert result.exit_code == 4
    assert "stream PROXY exists with a different configuration" in result.stderr
    assert "max_age" in result.stderr
    assert "Traceback" not in result.output


async def test_streams_init_rejects_an_impossible_replica_count(
    nats_server: EmbeddedNatsServer,
) -> None:
    result = await cli("streams", "init", "--replicas", "2", "--nats-url", nats_server.url)
    assert result.exit_code == 2
    assert "--stream-replicas / STREAM_REPLICAS: 2" in result.stderr


async def test_streams_info_shows_each_stream(
    nats_server: EmbeddedNatsServer,
) -> None:
    before = await cli("streams", "info", "--nats-url", nats_server.url)
    assert before.exit_code == 0, before.output
    assert before.stdout.count("missing") == len(STREAMS)

    conn = await connect(nats_server.url)
    try:
        await cli("streams", "init", "--nats-url", nats_server.url)
        await seed_proxy(JetStreamEventStore(conn.nc, conn.js), "p1")
    finally:
        await conn.close()
    after = await cli("streams", "info", "--nats-url", nats_server.url)
    assert after.exit_code == 0, after.output
    assert "MESSAGES" in after.stdout
    assert "CONSUMERS" in after.stdout
    proxy_row = next(line for line in after.stdout.splitlines() if "PROXY" in line)
    figures = proxy_row.replace("│", " ").split()
    assert figures[:3] == ["PROXY", "proxy.*.*", "4"]
    assert figures[-4:] == ["1", "4", "1", "0"]
    lease_row = next(line for line in after.stdout.splitlines() if "LEASE" in line)
    assert "lease.*" in lease_row
    assert "missing" not in after.stdout
