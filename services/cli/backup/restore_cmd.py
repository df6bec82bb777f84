"""``restore DIR``: a backup (``backup_cmd``) checked file by file, then handed stream by stream to
JetStream's restore API, before the services start on it.

Nothing on the server changes until every file has passed its checks (a damaged backup exits 13
naming the file). A server that holds a log is replaced only with ``--force``, and never while
anything reads it. Each stream comes back under its own sequences and timestamps, the services'
durables at their acknowledged floors, and LEASE ends ``--lease-headroom`` sequences past what the
lost system is known to have granted, so every new fencing token is above the old ones
(docs/operations.md, "Backup and restore"; docs/decisions, D102).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from events.errors import EventStoreError
from services.cli.backup import files as backup_files
from services.cli.backup import streamio as backup_io
from services.cli.backup.backup_cmd import EPILOG, Damaged, progress_bar, sign_key_option
from services.cli.common import (
    CliState,
    open_connection,
    run_until_signalled,
    settings_for,
    settings_options,
    stdout_console,
)
from services.cli.pure.backup_archive import archive, s2_stream, state
from services.cli.pure.backup_manifest import (
    MANIFEST,
    BackupDamaged,
    Manifest,
    StreamCheck,
    StreamEntry,
    decode_manifest,
    lease_last_seq,
)
from services.cli.pure.backup_sign import verify
from services.runtime.eventlog.streams import STREAMS
from services.runtime.nats.connection import Connection
from services.runtime.nats.users import CONSUMERS
from services.runtime.settings.errors import ConfigError

DEFAULT_HEADROOM = 1_000_000
MAX_HEADROOM = 100_000_000
"""Each skipped sequence costs the server about 40 ns at every start while the LEASE stream's
oldest messages are kept (7 days): a hundred million is 4 s (docs/operations.md)."""
MIN_SERVER = (2, 15)
"""The first nats-server whose restore API reads the archive ``backup_archive`` writes."""


@click.command("restore", epilog=EPILOG)
@settings_options()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--force",
    is_flag=True,
    help="Replace streams that hold events (the log they hold is deleted first).",
)
@click.option(
    "--lease-headroom",
    type=click.IntRange(0, MAX_HEADROOM),
    default=DEFAULT_HEADROOM,
    show_default=True,
    help="LEASE events the lost system may have written after the backup: the next fencing "
    "token starts above them.",
)
@click.option(
    "--replicas",
    type=click.IntRange(1, 5),
    default=None,
    help="Copies of each stream [default: as backed up].",
)
@click.option(
    "--check",
    is_flag=True,
    help="Only check the backup's files; no server is used. Without --sign-key it proves the "
    "files agree with the manifest, not who wrote them.",
)
@sign_key_option()
@click.pass_obj
def restore(
    state_: CliState,
    /,
    *,
    nats_url: str | None,
    directory: Path,
    force: bool,
    lease_headroom: int,
    replicas: int | None,
    check: bool,
    sign_key: Path | None,
) -> None:
    """Restore the event log from a backup DIRECTORY, before the services start on it.

    Every file is checked first (checksums, sequences, the cut, and with a signing key the
    manifest's signature); a damaged or altered backup changes nothing. The streams come back
    with their own sequences and times, the services' durable consumers at what they had
    acknowledged. Events after the backup's instant are lost.
    """
    console = stdout_console()
    key = backup_files.sign_key(sign_key)
    try:
        manifest, checks, signed = _verify(directory, console, key)
    except BackupDamaged as exc:
        raise Damaged(f"{directory}/{exc}; nothing was restored") from None
    if check:
        console.print(Text(f"{directory}: {_proven(manifest, key, signed)}"))
        return
    settings = settings_for(state_, nats_url=nats_url)
    plan = Plan(
        directory=directory,
        manifest=manifest,
        checks=checks,
        force=force,
        headroom=lease_headroom,
        replicas=replicas,
    )
    done = run_until_signalled(_restore(settings.nats_url, plan))
    if done is None:
        return
    console.print(_restore_table(manifest, done))
    for entry in manifest.streams:
        spec = next(s for s in STREAMS if s.name == entry.name)
        kept = replicas or int(entry.config.get("num_replicas") or 1)
        changed = backup_io.differences_from(spec, entry, kept)
        if changed:
            # The services refuse other settings at start-up: this version's are restored.
            console.print(
                Text(f"{entry.name}: restored with this version's settings ({'; '.join(changed)})")
            )
    lease = done["LEASE"]["state"]["last_seq"]
    console.print(
        Text(
            f"the log is back as it was at {manifest.cut}; what was appended after that instant "
            f"is not. LEASE continues after {lease:,}, so every fencing token is above those "
            "granted before. Start the services on it now."
        )
    )


def _proven(manifest: Manifest, key: bytes | None, signed: bool) -> str:
    """What ``--check`` proves, and no more (docs/operations.md, "Backup and restore")."""
    whole = f"a complete backup of the log as it was at {manifest.cut}, consistent throughout"
    if key is not None:
        return f"{whole}, signed with this key: its files are those the backup wrote"
    if signed:
        return (
            f"{whole}; it is signed, but the signature was not checked: give --sign-key to "
            "prove nobody changed it"
        )
    return (
        f"{whole}; unsigned: this proves the files agree with the manifest, not that nobody "
        "rewrote both (sign backups with --sign-key)"
    )


def _verify(
    directory: Path, console: Any, key: bytes | None
) -> tuple[Manifest, dict[str, StreamCheck], bool]:
    data = backup_files.read_regular(directory / MANIFEST, MANIFEST)
    if data is None:
        raise BackupDamaged(
            MANIFEST, "is missing: this is not a backup, or the backup did not finish"
        )
    signature = backup_files.read_signature(directory)
    if key is not None:
        # Before anything the manifest says is believed.
        verify(key, data, signature)
    manifest = decode_manifest(data, {spec.name: spec.subjects for spec in STREAMS})
    checks = {}
    with progress_bar(console) as bar:
        for entry in manifest.streams:
            task = bar.add_task(f"check {entry.name}", total=max(entry.messages, 1))
            seen = _counter(bar, task)
            checks[entry.name] = backup_io.check_stream(directory, entry, manifest.cut_ns, seen)
    return manifest, checks, signature is not None


def _counter(bar: Progress, task: Any) -> Any:
    def seen(seq: int) -> None:
        del seq
        bar.advance(task)

    return seen


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A restore, checked and decided before anything on the server changes."""

    directory: Path
    manifest: Manifest
    checks: dict[str, StreamCheck]
    force: bool
    headroom: int
    replicas: int | None


async def _restore(url: str, plan: Plan) -> dict[str, dict[str, Any]]:
    conn = await open_connection(url)
    try:
        nc = conn.nc
        version = nc.connected_server_version
        if (version.major, version.minor) < MIN_SERVER:
            raise EventStoreError(
                f"nats-server {version} cannot restore this backup: its restore API reads the "
                f"format from nats-server {'.'.join(map(str, MIN_SERVER))} on"
            )
        target = await backup_io.inspect(nc)
        if target.busy:
            raise ConfigError(
                "services are running against this server ("
                + "; ".join(target.busy)
                + "): stop them before a restore, and start them on the restored log"
            )
        holding = target.holding()
        if holding and not plan.force:
            listed = ", ".join(f"{name} ({count:,} events)" for name, count in holding.items())
            raise ConfigError(
                f"the server already holds a log: {listed}. A restore replaces it; give --force "
                "to delete it and restore the backup in its place"
            )
        lease = plan.manifest.stream("LEASE")
        assert lease is not None  # decode_manifest holds every declared stream
        lease_last = lease_last_seq(lease, target.last_seq("LEASE"), plan.headroom)
        await backup_io.clear(nc, target)
        done = {}
        with progress_bar(stdout_console()) as bar:
            for spec in STREAMS:
                entry = plan.manifest.stream(spec.name)
                assert entry is not None
                last = lease_last if spec.name == "LEASE" else entry.last_seq
                done[spec.name] = await _restore_stream(conn, plan, entry, last, bar)
        return done
    finally:
        await conn.close()


async def _restore_stream(
    conn: Connection, plan: Plan, entry: StreamEntry, last_seq: int, bar: Progress
) -> dict[str, Any]:
    spec = next(s for s in STREAMS if s.name == entry.name)
    replicas = plan.replicas or int(entry.config.get("num_replicas") or 1)
    durables = [c for c in entry.consumers if CONSUMERS.get(c.name) == entry.name]
    wanted = state(
        first_seq=entry.first_seq,
        last_seq=last_seq,
        messages=entry.messages,
        size=entry.bytes,
        consumers=len(durables),
    )
    task = bar.add_task(f"restore {entry.name}", total=max(entry.bytes, 1))
    payload = s2_stream(archive(wanted, durables, backup_io.records(plan.directory, entry)))
    done = await backup_io.send_restore(
        conn.nc,
        entry.name,
        config=backup_io.restore_config(spec, replicas),
        state=wanted,
        payload=payload,
        sent=lambda size: bar.advance(task, size),
    )
    _check_restored(entry, done, last_seq, plan.checks[entry.name])
    for durable in durables:
        info = await backup_io.api(conn.nc, f"$JS.API.CONSUMER.INFO.{entry.name}.{durable.name}")
        if int(info["ack_floor"]["stream_seq"]) != durable.ack_floor_stream_seq:
            raise EventStoreError(
                f"restored durable {durable.name} is acknowledged up to "
                f"{info['ack_floor']['stream_seq']}, the backup's up to "
                f"{durable.ack_floor_stream_seq}"
            )
    return done


def _check_restored(
    entry: StreamEntry, done: dict[str, Any], last_seq: int, check: StreamCheck
) -> None:
    """The server holds what the backup held: every message (some of the oldest may have
    expired at once, if the stream's age limit passed them since), under the same sequences."""
    got = done.get("state") or {}
    messages, last = int(got.get("messages", -1)), int(got.get("last_seq", -1))
    max_age_ns = int((done.get("config") or {}).get("max_age") or 0)
    aged = bool(max_age_ns) and check.first_ts < time.time_ns() - max_age_ns
    exact = messages == entry.messages and int(got.get("bytes", -1)) == entry.bytes
    if last != last_seq or not (exact or (aged and messages < entry.messages)):
        raise EventStoreError(
            f"restored {entry.name} holds {messages} events up to sequence {last}; the backup "
            f"has {entry.messages} up to {entry.last_seq} (the stream to continue after "
            f"{last_seq}): restore again with --force"
        )


def _restore_table(manifest: Manifest, done: dict[str, dict[str, Any]]) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in ("STREAM", "EVENTS", "SEQUENCES", "NEXT", "DURABLES"):
        table.add_column(column)
    for entry in manifest.streams:
        got = done[entry.name]["state"]
        table.add_row(
            entry.name,
            f"{int(got['messages']):,}",
            f"{entry.first_seq}..{entry.last_seq}" if entry.messages else "-",
            f"{int(got['last_seq']) + 1:,}",
            " ".join(f"{c.name}@{c.ack_floor_stream_seq}" for c in entry.consumers) or "-",
        )
    return table
