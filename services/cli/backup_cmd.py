"""``backup DIR`` and ``restore DIR``: the log, the system's only memory, copied out and back.

A backup is every stream as it was at one instant (the cut, ``backup_io``), with the durable
consumers' acknowledged floors; the cache and membership buckets are left out (they are rebuilt
or renewed by the services). A restore checks every file of the backup before it changes
anything, refuses to replace a log that holds events unless told to (``--force``) and any log
that services are using, then hands each stream to JetStream's restore API with its own sequences
and timestamps, and its consumers at their floors. The LEASE stream continues past every fencing
token granted before the restore (``--lease-headroom``). docs/operations.md, "Backup and restore",
says how often, what it costs and what a restore loses; docs/decisions, D102, why it is built on
the restore API and not the ``nats`` CLI.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from events.errors import EventStoreError
from services.cli import backup_io
from services.cli.common import (
    CliState,
    Unfinished,
    open_connection,
    run_until_signalled,
    settings_for,
    settings_options,
    stdout_console,
)
from services.cli.pure.backup_archive import archive, s2_stream, state
from services.cli.pure.backup_manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    BackupDamaged,
    Manifest,
    Record,
    StreamCheck,
    StreamEntry,
    decode_manifest,
    encode_manifest,
    format_ns,
    lease_last_seq,
    parse_rfc3339_ns,
    stored_size,
    stream_file,
)
from services.runtime.connection import Connection
from services.runtime.errors import ConfigError
from services.runtime.eventlog.streams import STREAMS
from services.runtime.natsusers import CONSUMERS
from services.runtime.version import VERSION

EXIT_BACKUP_DAMAGED = 13
DEFAULT_HEADROOM = 1_000_000
MAX_HEADROOM = 100_000_000
"""Each skipped sequence costs the server about 40 ns at every start while the LEASE stream's
oldest messages are kept (7 days): a hundred million is 4 s (docs/operations.md)."""
MIN_SERVER = (2, 15)
"""The first nats-server whose restore API reads the archive ``backup_archive`` writes."""

EPILOG = """\b
Exit codes: 0 done; 2 DIR is not empty (backup), the server holds a log or runs services
(restore); 3 NATS unreachable; 4 the server refused; 13 restore: the backup is incomplete,
damaged or altered (the error names the file); nothing was changed.
"""


class Damaged(Unfinished):
    exit_code = EXIT_BACKUP_DAMAGED


def _progress(console: Any) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        # A bar is for a person: into a pipe or a file it would print a blank line.
        disable=not console.is_terminal,
    )


@click.command("backup", epilog=EPILOG)
@settings_options()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.pass_obj
def backup(state_: CliState, nats_url: str | None, directory: Path) -> None:
    """Copy the event log, as it was at one instant, into DIRECTORY (new or empty).

    Every stream is cut at the same instant, so the copy is a state the system was in; the
    services keep running meanwhile. Reading needs no more than the reader user.
    """
    settings = settings_for(state_, nats_url=nats_url)
    _prepare(directory)
    written: list[Path] = []
    try:
        manifest = run_until_signalled(_backup(settings.nats_url, directory, written))
    except BaseException:
        _discard(written)
        raise
    if manifest is None:  # stopped by a signal: no manifest, so never taken for a backup
        _discard(written)
        return
    console = stdout_console()
    console.print(_backup_table(manifest))
    size = sum(entry.size for entry in manifest.streams)
    console.print(
        Text(
            f"{directory}: the log as it was at {manifest.cut} ({size:,} bytes, "
            f"{manifest.seconds:.1f}s); events after that instant are not in it"
        )
    )


def _prepare(directory: Path) -> None:
    if directory.exists() and any(directory.iterdir()):
        raise ConfigError(
            f"{directory} is not empty: give a new or empty directory (a backup never "
            "overwrites files)"
        )
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)


def _discard(written: list[Path]) -> None:
    for path in written:
        with contextlib.suppress(OSError):
            path.unlink()


async def _backup(url: str, directory: Path, written: list[Path]) -> Manifest:
    started, conn = time.monotonic(), await open_connection(url)
    try:
        # The durables first: their floors are true at the cut, which comes after (backup_io).
        consumers, cut_ns = await backup_io.durable_floors(conn.nc)
        infos = {}
        for spec in STREAMS:
            infos[spec.name] = await backup_io.stream_info(conn.nc, spec.name)
            cut_ns = cut_ns or parse_rfc3339_ns(infos[spec.name]["ts"])
        entries = []
        with _progress(stdout_console()) as bar:
            for spec in STREAMS:
                path = directory / stream_file(spec.name)
                written.append(path)
                entry = await _copy(
                    conn,
                    spec.name,
                    info=infos[spec.name],
                    cut_ns=cut_ns,
                    path=path,
                    bar=bar,
                    consumers=consumers,
                )
                entries.append(entry)
        manifest = Manifest(
            format=FORMAT,
            version=FORMAT_VERSION,
            product_version=VERSION,
            server_version=str(conn.nc.connected_server_version),
            cut=format_ns(cut_ns),
            cut_ns=cut_ns,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            seconds=round(time.monotonic() - started, 3),
            streams=entries,
            left_out=backup_io.LEFT_OUT,
        )
        _write_manifest(directory, manifest, written)
        return manifest
    finally:
        await conn.close()


async def _copy(
    conn: Connection,
    name: str,
    *,
    info: dict[str, Any],
    cut_ns: int,
    path: Path,
    bar: Progress,
    consumers: dict[str, list[Any]],
) -> StreamEntry:
    first, last = int(info["state"]["first_seq"]), int(info["state"]["last_seq"])
    task = bar.add_task(f"backup {name}", total=max(last - first + 1, 1))
    out = backup_io.StreamFile(path)
    kept = {"messages": 0, "bytes": 0, "last": 0}

    def each(record: Record) -> None:
        out.add(record)
        kept["messages"] += 1
        kept["bytes"] += stored_size(record)
        kept["last"] = record.seq
        bar.update(task, completed=record.seq - first + 1)

    try:
        await backup_io.read_stream(
            conn, name, first_seq=first, last_seq=last, cut_ns=cut_ns, each=each
        )
    except BaseException:
        out.abandon()
        raise
    out.close()
    last_kept = kept["last"] or max(first - 1, 0)
    return StreamEntry(
        name=name,
        file=path.name,
        sha256=out.digest.hexdigest(),
        size=out.size,
        messages=kept["messages"],
        bytes=kept["bytes"],
        first_seq=first,
        last_seq=last_kept,
        observed_last_seq=max(last, last_kept),
        config=info["config"],
        consumers=[c for c in consumers.get(name, []) if c.ack_floor_stream_seq <= last_kept],
    )


def _write_manifest(directory: Path, manifest: Manifest, written: list[Path]) -> None:
    """Last, and whole or not at all: a directory without it is no backup (restore says so)."""
    final, partial = directory / MANIFEST, directory / f".{MANIFEST}.partial"
    written.append(partial)
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
        out.write(encode_manifest(manifest))
        out.flush()
        os.fsync(out.fileno())
    partial.rename(final)
    written.append(final)
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _backup_table(manifest: Manifest) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in ("STREAM", "EVENTS", "SEQUENCES", "BYTES", "FILE", "DURABLES"):
        table.add_column(column)
    for entry in manifest.streams:
        table.add_row(
            entry.name,
            f"{entry.messages:,}",
            f"{entry.first_seq}..{entry.last_seq}",
            f"{entry.size:,}",
            entry.file,
            " ".join(f"{c.name}@{c.ack_floor_stream_seq}" for c in entry.consumers) or "-",
        )
    return table


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
@click.option("--check", is_flag=True, help="Only check the backup's files; no server is used.")
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
) -> None:
    """Restore the event log from a backup DIRECTORY, before the services start on it.

    Every file is checked first (checksums, sequences, the cut); a damaged backup changes
    nothing. The streams come back with their own sequences and times, the services' durable
    consumers at what they had acknowledged. Events after the backup's instant are lost.
    """
    console = stdout_console()
    try:
        manifest, checks = _verify(directory, console)
    except BackupDamaged as exc:
        raise Damaged(f"{directory}/{exc}; nothing was restored") from None
    if check:
        console.print(
            Text(f"{directory}: a complete backup of the log as it was at {manifest.cut}")
        )
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
    lease = done["LEASE"]["state"]["last_seq"]
    console.print(
        Text(
            f"the log is back as it was at {manifest.cut}; what was appended after that instant "
            f"is not. LEASE continues after {lease:,}, so every fencing token is above those "
            "granted before. Start the services on it now."
        )
    )


def _verify(directory: Path, console: Any) -> tuple[Manifest, dict[str, StreamCheck]]:
    path = directory / MANIFEST
    if not path.is_file():
        raise BackupDamaged(
            MANIFEST, "is missing: this is not a backup, or the backup did not finish"
        )
    manifest = decode_manifest(path.read_bytes(), {spec.name: spec.subjects for spec in STREAMS})
    checks = {}
    with _progress(console) as bar:
        for entry in manifest.streams:
            task = bar.add_task(f"check {entry.name}", total=max(entry.messages, 1))
            seen = _counter(bar, task)
            checks[entry.name] = backup_io.check_stream(directory, entry, manifest.cut_ns, seen)
    return manifest, checks


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
        with _progress(stdout_console()) as bar:
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
            f"{entry.first_seq}..{entry.last_seq}",
            f"{int(got['last_seq']) + 1:,}",
            " ".join(f"{c.name}@{c.ack_floor_stream_seq}" for c in entry.consumers) or "-",
        )
    return table
