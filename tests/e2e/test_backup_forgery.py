"""Hostile backups, on real nats-servers (docs/operations.md, "Backup and restore";
docs/decisions/0136-a-store-is-found-by-what-runs-on-it.md, "Backups").

A manifest whose LEASE ``observed_last_seq`` is 2^63 - 1 (or any sequence no backup could have
seen) is refused naming the field, and the target's log is untouched: restored, it wrapped, and
fencing tokens began again at 1,000,000 after a restart. A stream file that is a symbolic link
is refused naming it, even when it points at the very file the backup wrote. A consistent
forgery (an event rewritten, the checksums recomputed) passes an unsigned ``--check``, which
says it proves no more; with ``--sign-key`` the backup is signed and the forgery refused, as is
a signed backup whose signature is gone. A restored LEASE keeps its sequence across a restart
of the server, so every new fencing token stays above the old ones.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from services.cli.pure.backup_manifest import END, MAGIC, Record, RecordReader, encode_record
from services.runtime.nats.connection import connect
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.backups import (
    backed_up,
    run,
    said,
    seeded,
    state_of,
    two_servers,  # noqa: F401  # the fixture `servers`
)

pytestmark = pytest.mark.e2e

KEY = "k" * 16 + "0123456789abcdef0123456789abcdef"


def edit_manifest(backup: Path, stream: str, **fields: object) -> None:
    manifest = json.loads((backup / "manifest.json").read_text())
    entry = next(e for e in manifest["streams"] if e["name"] == stream)
    entry.update(fields)
    (backup / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def forge(backup: Path) -> None:
    """Rewrite every LEASE event's payload to one of the same length, then recompute the file's
    checksum and size in the manifest: consistent, as an attacker with the directory makes it."""
    path = backup / "LEASE.events.gz"
    reader = RecordReader("LEASE.events.gz")
    records = reader.feed(gzip.decompress(path.read_bytes()))
    assert records, "the seeded log has LEASE events to forge"
    body = b"".join(encode_record(Record(r.seq, r.ts, r.subject, r.header, b"[]")) for r in records)
    raw = gzip.compress(MAGIC + body + END, mtime=0)
    path.write_bytes(raw)
    edit_manifest(backup, "LEASE", sha256=hashlib.sha256(raw).hexdigest(), size=len(raw))


def refused_each_way(
    backup: Path, target: EmbeddedNatsServer, named: str, problem: str, *args: str
) -> None:
    """``restore --check`` and ``restore --force`` alike exit 13 naming the file and the
    problem, without a traceback."""
    for way in ("--check", "--force"):
        refused = run("restore", str(backup), way, *args, url=target.admin_url)
        assert refused.returncode == 13, refused.stdout + refused.stderr
        assert f"{backup}/{named}" in refused.stderr, refused.stderr
        assert problem in said(refused), refused.stderr
        assert "Traceback" not in refused.stderr


@pytest.mark.parametrize(
    ("how", "named", "problem"),
    [
        ("observed-max", "manifest.json", "observed_last_seq"),
        ("observed-far", "manifest.json", "observed_last_seq"),
        ("link", "LEASE.events.gz", "symbolic link"),
    ],
)
async def test_a_forged_sequence_or_a_linked_file_is_refused_and_the_log_untouched(
    tmp_path: Path,
    servers: tuple[EmbeddedNatsServer, EmbeddedNatsServer],
    how: str,
    named: str,
    problem: str,
) -> None:
    _, target = servers
    backup = tmp_path / "backup"
    before = await backed_up(servers, backup, source_events=20, target_events=5)
    if how == "observed-max":
        edit_manifest(backup, "LEASE", observed_last_seq=2**63 - 1)
    elif how == "observed-far":
        lease = next(
            e
            for e in json.loads((backup / "manifest.json").read_text())["streams"]
            if e["name"] == "LEASE"
        )
        edit_manifest(backup, "LEASE", observed_last_seq=lease["last_seq"] + 10**12)
    else:
        # The very bytes the backup wrote, moved outside the directory and linked back.
        outside = tmp_path / "elsewhere.gz"
        (backup / "LEASE.events.gz").rename(outside)
        (backup / "LEASE.events.gz").symlink_to(outside)
    refused_each_way(backup, target, named, problem)
    assert await state_of(target) == before


async def test_a_signed_backup_refuses_a_consistent_forgery_and_a_lost_signature(
    tmp_path: Path, servers: tuple[EmbeddedNatsServer, EmbeddedNatsServer]
) -> None:
    _, target = servers
    key_file = tmp_path / "backup.key"
    key_file.write_text(KEY + "\n")
    backup = tmp_path / "backup"
    sign = ("--sign-key", str(key_file))
    before = await backed_up(servers, backup, *sign, source_events=20, target_events=5)
    assert (backup / "manifest.json.hmac").is_file()
    checked = run("restore", str(backup), "--check", *sign, url="")
    assert checked.returncode == 0, checked.stderr
    assert "signed with this key" in said(checked)

    forge(backup)
    unsigned_check = run("restore", str(backup), "--check", url="")
    # Without the key, a consistent forgery cannot be told, and the output says so.
    assert unsigned_check.returncode == 0, unsigned_check.stderr
    assert "signature was not checked" in said(unsigned_check)
    refused_each_way(backup, target, "manifest.json.hmac", "does not match", *sign)
    (backup / "manifest.json.hmac").unlink()
    missing = run("restore", str(backup), "--force", *sign, url="")
    assert missing.returncode == 13, missing.stdout + missing.stderr
    assert "manifest.json.hmac: is missing" in said(missing)
    short = tmp_path / "short.key"
    short.write_text("too short")
    bad_key = run("restore", str(backup), "--check", "--sign-key", str(short), url="")
    assert bad_key.returncode == 2, bad_key.stdout + bad_key.stderr
    assert "--sign-key" in bad_key.stderr
    assert await state_of(target) == before


async def test_a_restored_lease_stream_keeps_its_sequence_across_a_restart(
    tmp_path: Path, servers: tuple[EmbeddedNatsServer, EmbeddedNatsServer]
) -> None:
    source, target = servers
    wanted = await seeded(source, 20)
    backup = tmp_path / "backup"
    assert run("backup", str(backup), url=source.admin_url).returncode == 0
    restored = run("restore", str(backup), url=target.admin_url)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    after = wanted["LEASE"][1] + 1_000_000
    assert f"LEASE continues after {after:,}" in said(restored)
    await target.stop()
    await target.start()
    conn = await connect(target.admin_url)
    try:
        ack = await conn.js.publish("lease.after-restart", b"{}")
        assert ack.seq == after + 1, "the next fencing token is above every one granted before"
    finally:
        await conn.close()
