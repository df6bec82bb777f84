"""The data dir's lock and the registry's stale entries, without a server (docs/decisions/,
D94); tests/reliability/test_data_dir_*.py hold them with real `up` processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.runtime.datadir import LOCK_FILE, DataDirBusy, exclusive
from services.runtime.nats.registry import announce
from services.runtime.nats.stale import announced_credentials, serves


def no_such_pid() -> int:
    """Above the kernel's largest pid: never a live process."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def test_a_held_data_dir_is_refused_naming_the_holder(tmp_path: Path) -> None:
    with exclusive(tmp_path / "data"):
        assert (tmp_path / "data" / LOCK_FILE).stat().st_mode & 0o777 == 0o600
        with pytest.raises(DataDirBusy) as refused, exclusive(tmp_path / "data"):
            pass
        assert refused.value.pid == os.getpid()
        assert f"pid {os.getpid()}" in str(refused.value)
    # Freed with the block: the next holder takes it.
    with exclusive(tmp_path / "data"):
        pass


def test_an_announcement_of_a_dead_server_is_stale(tmp_path: Path) -> None:
    credentials = tmp_path / "credentials.json"
    announce(14301, credentials, os.getpid())
    announce(14302, credentials, no_such_pid())
    announce(14303, credentials)  # an older version's entry, without a pid
    assert announced_credentials(14301) == credentials
    assert announced_credentials(14302) is None
    assert announced_credentials(14303) == credentials
    assert announced_credentials(14304) is None


def test_only_a_nats_server_on_this_config_is_ours_to_stop(tmp_path: Path) -> None:
    assert not serves(os.getpid(), tmp_path / "nats-server.conf")
    assert not serves(no_such_pid(), tmp_path / "nats-server.conf")
