"""Fixtures shared by every test: real nats-servers spawned from the wheel, on free ports."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from events.jetstream import JetStreamEventStore
from events.streams import ensure_streams
from services.runtime.connection import Connection, connect
from services.runtime.natsserver import EmbeddedNatsServer

# Tests send traffic to this machine only: every health prober a test starts (in-process, or
# through `up` / `run health` subprocesses, which inherit this) checks a loopback address, never
# the product's external default.
os.environ["HEALTH_CHECK_URL"] = "http://127.0.0.1:9/no-external-checks-in-tests"


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[EmbeddedNatsServer]:
    server = EmbeddedNatsServer(data_dir=tmp_path / "nats")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def conn(nats_server: EmbeddedNatsServer) -> AsyncIterator[Connection]:
    connection = await connect(nats_server.url)
    await ensure_streams(connection.js)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
def jetstream_store(conn: Connection) -> JetStreamEventStore:
    return JetStreamEventStore(conn.nc, conn.js)
