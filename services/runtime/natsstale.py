"""What an embedded nats-server can leave behind when its `up` dies, and how the next one and the
clients tell (docs/decisions/0094-one-data-dir-one-up-one-nats.md).

A server still running on the store: its pid is in the store's pid file and in its announcement.
The next `up` on that data dir (which holds the data dir's lock, ``datadir.exclusive``) stops it
before starting its own, after checking that the pid really runs nats-server with this data dir's
configuration: a pid the system reused for something else is left alone.

An announcement (``natsregistry.announce``) of a server that is gone: it names the server's pid, so
a client skips it (``announced_credentials``) rather than taking that data dir's credentials to
whatever listens on the port now, and the next `up` removes it.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import structlog

from services.runtime.datadir import alive, command_line, stop_process
from services.runtime.natsregistry import registry_dir, registry_entry
from services.runtime.natsserver import PID_FILE, EmbeddedNatsServer

log = structlog.get_logger("egress.nats-server")


def announced_credentials(port: int) -> Path | None:
    """The credentials file of this user's server on ``port``; None when none is announced there
    or the announced server is gone. An entry without a pid (older versions) is taken as is."""
    found = _read(registry_entry(port))
    if found is None:
        return None
    pid = found.get("pid")
    if isinstance(pid, int) and not alive(pid):
        return None
    return Path(found["credentials"])


def serves(pid: int, config: Path) -> bool:
    """Whether ``pid`` is a nats-server started with ``config``."""
    argv = command_line(pid)
    if not argv or not Path(argv[0]).name.startswith("nats-server"):
        return False
    return str(config) in argv or " ".join(argv).endswith(f" {config}")


async def stop_leftovers(server: EmbeddedNatsServer) -> list[int]:
    """Stop every nats-server still running on ``server``'s store, and remove every announcement
    of its data dir; returns the pids stopped. Call it holding the data dir's lock, before
    ``server.start()``."""
    config = server.config_file
    stopped = []
    for pid in sorted(set(_pid_file(server.data_dir / PID_FILE) + _announced(server))):
        if pid == os.getpid() or not alive(pid) or not serves(pid, config):
            continue
        log.warning("stopping a nats-server left running on this data dir", pid=pid)
        await stop_process(pid)
        stopped.append(pid)
    for entry in _entries():
        found = _read(entry)
        if found is not None and found["credentials"] == str(server.credentials_file):
            with contextlib.suppress(OSError):
                entry.unlink()
    return stopped


def _pid_file(path: Path) -> list[int]:
    try:
        text = path.read_text().strip()
    except OSError:
        return []
    return [int(text)] if text.isdigit() else []


def _announced(server: EmbeddedNatsServer) -> list[int]:
    pids = []
    for entry in _entries():
        found = _read(entry)
        if found is not None and found["credentials"] == str(server.credentials_file):
            pid = found.get("pid")
            pids += [pid] if isinstance(pid, int) else []
    return pids


def _entries() -> list[Path]:
    try:
        return sorted(registry_dir().glob("nats-*.json"))
    except OSError:
        return []


def _read(entry: Path) -> dict[str, Any] | None:
    """An entry of this user's, or None: someone else's must not decide whom we log in as, nor
    which process we stop."""
    try:
        if entry.stat().st_uid != os.getuid():
            return None
        found = json.loads(entry.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("credentials"), str):
        return None
    return found
