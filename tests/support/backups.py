"""Backups between two real nats-servers, for the tests of what a restore refuses
(tests/e2e/test_backup_refusals.py, tests/e2e/test_backup_forgery.py; docs/operations.md,
"Backup and restore"). The fixture ``servers`` (a source and a target) is imported by name:
``from tests.support.backups import two_servers  # noqa: F401``.

A refusal is judged by the target's log: a seeded target's state before the backup, and the
same state after every refused restore."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support import markers
from tests.support.system import base_env, cli

LogState = dict[str, tuple[int, int]]
"""Each stream's message count and last sequence."""


@pytest.fixture(name="servers")
@markers.starts("two nats-servers")
async def two_servers(
    tmp_path: Path,
) -> AsyncIterator[tuple[EmbeddedNatsServer, EmbeddedNatsServer]]:
    source = EmbeddedNatsServer(data_dir=tmp_path / "source")
    target = EmbeddedNatsServer(data_dir=tmp_path / "target")
    await source.start()
    await target.start()
    try:
        yield source, target
    finally:
        await source.stop()
        await target.stop()


async def seeded(server: EmbeddedNatsServer, events: int) -> LogState:
    """A log of ``events`` per stream, and a durable of the reconciler's; its state."""
    conn = await connect(server.admin_url)
    try:
        await ensure_streams(conn.js)
        for i in range(events):
            await conn.js.publish(f"proxy.u{i % 3}.declared", b'{"n": %d}' % i)
            await conn.js.publish(f"lease.u{i % 3}", b"{}")
        return await log_state(conn)
    finally:
        await conn.close()


async def log_state(conn: Connection) -> LogState:
    return {
        name: ((i := await conn.js.stream_info(name)).state.messages, i.state.last_seq)
        for name in ("PROXY", "LEASE", "GC", "DEADLETTER")
    }


async def state_of(server: EmbeddedNatsServer) -> LogState:
    """``log_state`` over a connection of its own, for a check after the CLI has run."""
    conn = await connect(server.admin_url)
    try:
        return await log_state(conn)
    finally:
        await conn.close()


def run(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return cli(*args, env={**base_env(), "NATS_URL": url})


def said(process: subprocess.CompletedProcess[str]) -> str:
    """What a command printed, its lines joined (a terminal's width wraps them)."""
    return " ".join((process.stdout + process.stderr).split())


async def backed_up(
    servers: tuple[EmbeddedNatsServer, EmbeddedNatsServer],
    backup: Path,
    *args: str,
    source_events: int,
    target_events: int,
) -> LogState:
    """A backup of a seeded source written to ``backup`` (``args`` go to ``backup``), beside a
    seeded target; the target's state, which a refused restore must leave as it is."""
    source, target = servers
    await seeded(source, source_events)
    before = await seeded(target, target_events)
    taken = run("backup", str(backup), *args, url=source.admin_url)
    assert taken.returncode == 0, taken.stderr
    return before
