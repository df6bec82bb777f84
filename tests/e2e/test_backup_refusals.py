"""What a restore refuses, on real nats-servers, and the stock CLI's way (docs/operations.md,
"Backup and restore"; docs/nats-cli.md, "Backups").

A truncated, corrupt, altered or unfinished backup is refused naming the file, and the log the
server held is untouched; so is a log that a restore without ``--force`` would replace, and one
that something reads. The end-to-end restore under a lease load is tests/e2e/test_backup.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import timedelta
from pathlib import Path

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.backups import (
    backed_up,
    log_state,
    run,
    seeded,
    state_of,
    two_servers,  # noqa: F401  # the fixture `servers`
)
from tests.support.natscli import NatsCli
from tests.support.waiting import until

pytestmark = pytest.mark.e2e


def damage(backup: Path, how: str) -> str:
    """Damage ``backup`` one way; the file the refusal must name."""
    if how == "truncated":
        lease = backup / "LEASE.events.gz"
        lease.write_bytes(lease.read_bytes()[:-20])
        return "LEASE.events.gz"
    if how == "corrupt":
        proxy = backup / "PROXY.events.gz"
        data = bytearray(proxy.read_bytes())
        data[len(data) // 2] ^= 0x55
        proxy.write_bytes(bytes(data))
        return "PROXY.events.gz"
    manifest = json.loads((backup / "manifest.json").read_text())
    if how == "unfinished":
        (backup / "manifest.json").unlink()
        return "manifest.json"
    entry = next(e for e in manifest["streams"] if e["name"] == "LEASE")
    entry["last_seq"] += 5  # an edit that claims more than the file holds
    entry["observed_last_seq"] += 5
    (backup / "manifest.json").write_text(json.dumps(manifest))
    return "LEASE.events.gz"


@pytest.mark.parametrize("how", ["truncated", "corrupt", "altered", "unfinished"])
async def test_a_damaged_backup_is_refused_and_the_log_is_untouched(
    tmp_path: Path, servers: tuple[EmbeddedNatsServer, EmbeddedNatsServer], how: str
) -> None:
    _, target = servers
    backup = tmp_path / "backup"
    before = await backed_up(servers, backup, source_events=30, target_events=7)
    named = damage(backup, how)
    refused = run("restore", str(backup), "--force", url=target.admin_url)
    assert refused.returncode == 13, refused.stdout + refused.stderr
    assert f"{backup}/{named}" in refused.stderr
    assert "nothing was restored" in refused.stderr
    assert await state_of(target) == before


async def test_a_restore_replaces_a_log_only_when_told_and_never_under_running_services(
    tmp_path: Path, servers: tuple[EmbeddedNatsServer, EmbeddedNatsServer]
) -> None:
    source, target = servers
    wanted = await seeded(source, 30)
    before = await seeded(target, 7)
    backup = tmp_path / "backup"
    # Taking a backup needs no more than the reader's rights.
    taken = run("backup", str(backup), url=source.url_for("reader"))
    assert taken.returncode == 0, taken.stdout + taken.stderr
    refused = run("restore", str(backup), url=target.admin_url)
    assert refused.returncode == 2
    assert "PROXY (7 events)" in refused.stderr
    assert "--force" in refused.stderr

    conn = await connect(target.admin_url)
    try:
        # A service reading its durable: a pull request waits on it.
        durable = ConsumerConfig(
            durable_name="reconciler",
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.NEW,
        )
        await conn.js.add_consumer("PROXY", durable)
        reading = await conn.js.pull_subscribe_bind("reconciler", stream="PROXY")
        waiting = asyncio.create_task(reading.fetch(1000, timeout=30))
        await until(lambda: _waiting(conn), timeout=10, what="a waiting pull request")
        busy = await asyncio.to_thread(run, "restore", str(backup), "--force", url=target.admin_url)
        assert busy.returncode == 2
        assert "services are running against this server" in busy.stderr
        assert "consumer reconciler is reading PROXY" in busy.stderr
        waiting.cancel()
        with contextlib.suppress(BaseException):
            await waiting
        await reading.unsubscribe()
        await conn.js.delete_consumer("PROXY", "reconciler")
        assert await log_state(conn) == before
    finally:
        await conn.close()

    replaced = run("restore", str(backup), "--force", url=target.admin_url)
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    now = await state_of(target)
    assert {k: v[0] for k, v in now.items()} == {k: v[0] for k, v in wanted.items()}
    # LEASE continues above both the backup's log and the one it replaced.
    assert now["LEASE"][1] == max(wanted["LEASE"][1], before["LEASE"][1]) + 1_000_000


async def _waiting(conn: Connection) -> bool:
    info = await conn.js.consumer_info("PROXY", "reconciler")
    return bool(info.num_waiting)


async def test_the_nats_cli_way_of_docs_nats_cli_md(
    tmp_path: Path, servers: tuple[EmbeddedNatsServer, EmbeddedNatsServer]
) -> None:
    """What docs/nats-cli.md, "Backups", says the stock CLI does: a copy of one stream, cut at
    an instant by `backup edit --before`, restored on a server without the stream; the restored
    stream continues after the copy's last sequence, no further."""
    source, target = servers
    await seeded(source, 10)
    conn = await connect(source.admin_url)
    try:
        seeded_last = (await conn.js.stream_info("LEASE")).state.last_seq
        cut = (await conn.js.get_msg("LEASE", seeded_last)).time
        await asyncio.sleep(0.05)
        for i in range(4):
            await conn.js.publish(f"lease.u{i}", b"{}")
        last = (await conn.js.stream_info("LEASE")).state.last_seq
    finally:
        await conn.close()
    assert cut is not None
    before = (cut + timedelta(milliseconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    copy, edited = tmp_path / "copy" / "LEASE", tmp_path / "cut" / "LEASE"
    admin = NatsCli(source.context_file, tmp_path / "home")
    await admin.ok("backup", "stream", "LEASE", str(copy), "--no-consumers", "--no-progress")
    await admin.ok("backup", "edit", str(copy), str(edited), "--before", before, "--no-progress")
    await NatsCli(target.context_file, tmp_path / "home").ok(
        "backup", "restore", "stream", str(edited), "--no-progress"
    )
    conn = await connect(target.admin_url)
    try:
        info = await conn.js.stream_info("LEASE")
        assert (info.state.messages, info.state.last_seq) == (10, last)
    finally:
        await conn.close()
