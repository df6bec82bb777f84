"""A stop is quiet: closing our own connection is not a disconnection worth a warning, while a
server that goes away still is one (a clean Ctrl-C of `up` used to log one per service)."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from services.runtime.nats.connection import connect
from services.runtime.nats.server import EmbeddedNatsServer

pytestmark = pytest.mark.integration


def _warned(logs: list[MutableMapping[str, Any]]) -> list[str]:
    return [str(e["event"]) for e in logs if e["log_level"] == "warning"]


async def test_closing_our_connection_warns_of_nothing(nats_server: EmbeddedNatsServer) -> None:
    conn = await connect(nats_server.url)
    with capture_logs() as logs:
        await conn.close()
        await asyncio.sleep(0.2)  # nats-py runs its callbacks as tasks
    assert "nats disconnected" not in _warned(logs)


async def test_a_server_that_goes_away_is_still_a_warning(
    nats_server: EmbeddedNatsServer,
) -> None:
    conn = await connect(nats_server.url)
    try:
        with capture_logs() as logs:
            await nats_server.stop()
            for _ in range(100):
                if "nats disconnected" in _warned(logs):
                    break
                await asyncio.sleep(0.05)
        assert "nats disconnected" in _warned(logs)
    finally:
        await conn.close()
