"""A backup's signature and its files as a restore opens them, on real files without a server
(services/cli/pure/backup_sign.py, services/cli/backup/files.py); the forged backups on real
servers are tests/e2e/test_backup_forgery.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.cli.backup.files import open_regular, sign_key
from services.cli.pure.backup_manifest import BackupDamaged
from services.cli.pure.backup_sign import SIGNATURE, check_key, sign, verify
from services.runtime.settings.errors import ConfigError

KEY = b"0123456789abcdef" * 4
MANIFEST = b'{"format": "egress-proxies-backup"}\n'


def test_a_signature_verifies_only_its_manifest_under_its_key() -> None:
    signature = sign(KEY, MANIFEST)
    verify(KEY, MANIFEST, signature)
    for key, manifest, given in (
        (KEY, MANIFEST + b" ", signature),
        (KEY[::-1], MANIFEST, signature),
        (KEY, MANIFEST, signature.replace(b"hmac-sha256:", b"hmac-sha1:")),
        (KEY, MANIFEST, b""),
    ):
        with pytest.raises(BackupDamaged, match="does not match") as refused:
            verify(key, manifest, given)
        assert refused.value.file == SIGNATURE
    with pytest.raises(BackupDamaged, match="is missing"):
        verify(KEY, MANIFEST, None)


def test_a_short_key_is_refused_naming_where_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="--sign-key x: the signing key has 5 bytes"):
        check_key(b"short", "--sign-key x")
    monkeypatch.delenv("EGRESS_BACKUP_SIGN_KEY", raising=False)
    assert sign_key(None) is None
    path = tmp_path / "key"
    path.write_text(KEY.decode() + "\n")
    assert sign_key(path) == KEY
    monkeypatch.setenv("EGRESS_BACKUP_SIGN_KEY", "tiny")
    with pytest.raises(ConfigError, match="both set"):
        sign_key(path)
    with pytest.raises(ConfigError, match="EGRESS_BACKUP_SIGN_KEY: the signing key has 4 bytes"):
        sign_key(None)
    path.write_text("\n")
    monkeypatch.delenv("EGRESS_BACKUP_SIGN_KEY")
    with pytest.raises(ConfigError, match="is empty"):
        sign_key(path)


def test_only_regular_files_are_opened(tmp_path: Path) -> None:
    real = tmp_path / "outside.gz"
    real.write_bytes(b"data")
    link = tmp_path / "LEASE.events.gz"
    link.symlink_to(real)
    with pytest.raises(BackupDamaged, match="symbolic link") as refused:
        open_regular(link, "LEASE.events.gz")
    assert refused.value.file == "LEASE.events.gz"
    fifo = tmp_path / "PROXY.events.gz"
    os.mkfifo(fifo)
    with pytest.raises(BackupDamaged, match="not a regular file"):
        open_regular(fifo, "PROXY.events.gz")
    (tmp_path / "dir.gz").mkdir()
    with pytest.raises(BackupDamaged, match="not a regular file"):
        open_regular(tmp_path / "dir.gz", "dir.gz")
    assert open_regular(tmp_path / "absent.gz", "absent.gz") is None
    opened = open_regular(real, "outside.gz")
    assert opened is not None
    with opened:
        assert opened.read() == b"data"
