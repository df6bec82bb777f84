"""The files of a backup directory as a restore opens them, and the signing key
(docs/operations.md, "Backup and restore";
docs/decisions/0136-a-store-is-found-by-what-runs-on-it.md, "Backups").

Why only regular files, opened without following links: a stream file that is a symbolic link
makes ``--check`` vouch for a file outside the directory, one that may change between the check
and the restore, or that someone else owns. So a link, a device, a FIFO or a directory where a
backup file should be is refused naming it, and a file is opened with ``O_NOFOLLOW`` and checked
on its descriptor, so nothing can be swapped in between the look and the read.
"""

from __future__ import annotations

import hashlib
import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from services.cli.pure.backup_manifest import BackupDamaged, StreamEntry, check_file
from services.cli.pure.backup_sign import SIGNATURE, check_key
from services.runtime.settings.errors import ConfigError

SIGN_KEY_ENV = "EGRESS_BACKUP_SIGN_KEY"
"""The signing key itself; ``--sign-key FILE`` (``EGRESS_BACKUP_SIGN_KEY_FILE``) names a file
holding it instead."""
SIGN_KEY_FILE_ENV = "EGRESS_BACKUP_SIGN_KEY_FILE"
READ = 1 << 20


def open_regular(path: Path, file: str) -> BinaryIO | None:
    """``path`` opened for reading if it is a regular file; None if it does not exist; refused
    (``BackupDamaged`` naming ``file``) if it is a link or anything but a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if path.is_symlink():
            raise BackupDamaged(
                file,
                "is a symbolic link: a backup holds regular files only; copy the file itself "
                "into the backup directory",
            ) from None
        raise BackupDamaged(file, f"cannot be read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise BackupDamaged(file, "is not a regular file: a backup holds regular files only")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path: Path, file: str) -> bytes | None:
    opened = open_regular(path, file)
    if opened is None:
        return None
    with opened:
        return opened.read()


def read_signature(directory: Path) -> bytes | None:
    return read_regular(directory / SIGNATURE, SIGNATURE)


def sign_key(path: Path | None) -> bytes | None:
    """The signing key from ``--sign-key FILE`` or ``EGRESS_BACKUP_SIGN_KEY``; None when neither
    is given. ``ConfigError`` naming the option or variable when both are, or the key is
    unreadable, empty or too short."""
    value = os.environ.get(SIGN_KEY_ENV, "").strip()
    if path is not None and value:
        raise ConfigError(f"--sign-key and {SIGN_KEY_ENV} are both set; set one of them")
    where = SIGN_KEY_ENV
    if path is not None:
        where = f"--sign-key {path}"
        try:
            value = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read the signing key ({exc})") from exc
        if not value:
            raise ConfigError(f"{where} is empty; put a key in it, e.g. `openssl rand -hex 32`")
    if not value:
        return None
    try:
        return check_key(value.encode(), where)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _opened(path: Path, file: str) -> BinaryIO:
    """A backup file, regular and not a link (``backup.files``), or refused as missing."""
    opened = open_regular(path, file)
    if opened is None:
        raise BackupDamaged(file, "is missing from the backup")
    return opened


def file_digest(path: Path, file: str) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with _opened(path, file) as source:
        while chunk := source.read(READ):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def decompressed(path: Path, file: str, entry: StreamEntry | None = None) -> Iterator[bytes]:
    """A stream file's content, refusing a gzip stream that is damaged, cut short or followed by
    anything; with ``entry``, also a file that is no longer the one its manifest names (its size
    and SHA-256 are checked as it is read, before the last piece is handed on)."""
    inflate = zlib.decompressobj(wbits=31)
    digest, size = hashlib.sha256(), 0
    with _opened(path, file) as source:
        while chunk := source.read(READ):
            digest.update(chunk)
            size += len(chunk)
            if inflate.eof:
                raise BackupDamaged(file, "holds data after its compressed stream")
            try:
                piece = inflate.decompress(chunk)
            except zlib.error as exc:
                raise BackupDamaged(file, f"is damaged: {exc}") from None
            if entry is not None and size >= entry.size:
                # The whole file is read: it must be the one checked before it is restored.
                check_file(entry, size, digest.hexdigest())
            yield piece
    if entry is not None:
        check_file(entry, size, digest.hexdigest())
    if not inflate.eof:
        raise BackupDamaged(file, "is truncated: its compressed stream ends early")
    if inflate.unused_data:
        raise BackupDamaged(file, "holds data after its compressed stream")
