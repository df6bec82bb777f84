"""A discovery replica stops when asked, whatever its background work is doing: a cancellation
that nats-py swallows inside a fetch (the time-travel checkpoint writer waits in one almost all
the time) must not keep the service running until something kills it."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy

pytestmark = pytest.mark.integration

STOP_WITHIN = 30.0
"""Far beyond a stop's own work (the HTTP server's 1 s grace); a hang is what this catches."""


@pytest.mark.parametrize("idle", [0.0, 1.5])
async def test_a_replica_stops_after_start_up_or_when_idle(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, idle: float
) -> None:
    stack = contextlib.AsyncExitStack()
    service, _ = await stack.enter_async_context(discovery(nats_server.url))
    try:
        await ready_proxy(jetstream_store, "p1")
        await asyncio.sleep(idle)  # its background readers settle into waiting fetches
    finally:
        async with asyncio.timeout(STOP_WITHIN):
            await stack.aclose()
    assert service.bound_port
