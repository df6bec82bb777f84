"""``backup DIR``: the log, the system's only memory, copied out as it was at one instant.

A backup is every stream as it was at the cut (``backup.streamio``), with the services' durable
consumers at their acknowledged floors; the cache and membership buckets are left out (the
services rebuild or renew them). ``restore_cmd`` puts it back. docs/operations.md, "Backup and
restore", says how often, what it costs and what a restore loses; docs/decisions, D102, why it is
built on JetStream's restore API and not on the ``nats`` CLI.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from services.cli.backup import files as backup_files
from services.cli.backup import streamio as backup_io
from services.cli.backup.files import SIGN_KEY_FILE_ENV
from services.cli.common import (
    CliState,
    Unfinished,
    open_connection,
    run_until_signalled,
    settings_for,
    settings_options,
    stdout_console,
)
from services.cli.envoptions import with_env_option
from services.cli.pure.backup_manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    Manifest,
    Record,
    StreamEntry,
    encode_manifest,
    format_ns,
    stored_size,
    stream_file,
)
from services.cli.pure.backup_sign import SIGNATURE, sign
from services.runtime.eventlog.streams import STREAMS
from services.runtime.nats.connection import Connection
from services.runtime.settings.errors import ConfigError
from services.runtime.version import VERSION

F = TypeVar("F", bound=Callable[..., Any])
EXIT_BACKUP_DAMAGED = 13
SIGN_KEY_HELP = (
    "A file holding the key that signs the manifest (an HMAC-SHA256 in "
    "manifest.json.hmac); EGRESS_BACKUP_SIGN_KEY may hold the key itself. Keep it apart from "
    "the backups: with it, restore and --check refuse a backup changed after it was signed"
)
EPILOG = """\b
Exit codes: 0 done; 2 DIR is not empty (backup), the server holds a log or runs services
(restore); 3 NATS unreachable; 4 the server refused; 13 restore: the backup is incomplete,
damaged or altered (the error names the file); nothing was changed.
"""


class Damaged(Unfinished):
    exit_code = EXIT_BACKUP_DAMAGED


def progress_bar(console: Any) -> Progress:
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


def sign_key_option() -> Callable[[F], F]:
    """``--sign-key`` of both commands."""
    return with_env_option(
        "--sign-key",
        env=SIGN_KEY_FILE_ENV,
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help=SIGN_KEY_HELP,
    )


@click.command("backup", epilog=EPILOG)
@settings_options()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@sign_key_option()
@click.pass_obj
def backup(state_: CliState, nats_url: str | None, directory: Path, sign_key: Path | None) -> None:
    """Copy the event log, as it was at one instant, into DIRECTORY (new or empty).

    Every stream is cut at the same instant, so the copy is a state the system was in; the
    services keep running meanwhile. Reading needs no more than the reader user.
    """
    settings = settings_for(state_, nats_url=nats_url)
    key = backup_files.sign_key(sign_key)
    _prepare(directory)
    written: list[Path] = []
    try:
        manifest = run_until_signalled(_backup(settings.nats_url, directory, written, key))
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
            + ("; signed with the key (manifest.json.hmac)" if key is not None else "")
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


async def _backup(url: str, directory: Path, written: list[Path], key: bytes | None) -> Manifest:
    started, conn = time.monotonic(), await open_connection(url)
    try:
        # The durables first: their floors are true at the cut, which comes after (backup_io).
        consumers, cut_ns = await backup_io.durable_floors(conn.nc)
        infos = {}
        for spec in STREAMS:
            infos[spec.name] = await backup_io.stream_info(conn.nc, spec.name)
            cut_ns = cut_ns or backup_io.server_time(infos[spec.name])
        entries = []
        with progress_bar(stdout_console()) as bar:
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
        _write_manifest(directory, manifest, written, key)
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


def _write_manifest(
    directory: Path, manifest: Manifest, written: list[Path], key: bytes | None
) -> None:
    """Last, and whole or not at all: a directory without it is no backup (restore says so).
    Its signature, when there is a key, just before it."""
    data = encode_manifest(manifest)
    if key is not None:
        written.append(directory / SIGNATURE)
        _write_new(directory / SIGNATURE, sign(key, data))
    final, partial = directory / MANIFEST, directory / f".{MANIFEST}.partial"
    written.append(partial)
    _write_new(partial, data)
    partial.rename(final)
    written.append(final)
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_new(path: Path, data: bytes) -> None:
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def _backup_table(manifest: Manifest) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in ("STREAM", "EVENTS", "SEQUENCES", "BYTES", "FILE", "DURABLES"):
        table.add_column(column)
    for entry in manifest.streams:
        table.add_row(
            entry.name,
            f"{entry.messages:,}",
            f"{entry.first_seq}..{entry.last_seq}" if entry.messages else "-",
            f"{entry.size:,}",
            entry.file,
            " ".join(f"{c.name}@{c.ack_floor_stream_seq}" for c in entry.consumers) or "-",
        )
    return table
