"""What an embedded nats-server can leave behind when its `up` dies, and how the next one and the
clients tell (docs/decisions/0094-one-data-dir-one-up-one-nats.md).

A server still running on the store: its pid is in the store's pid file and in its announcement.
The next `up` on that data dir (which holds the data dir's lock, ``datadir.exclusive``) stops it
before starting its own, after checking that the pid really runs nats-server with this data dir's
configuration as `up` starts it: a pid the system reused for something else is left alone.

Any other process on the store (a nats-server started by hand, with a relative ``-c`` or another
configuration naming the same store, or any process with a file of the store open) is not ours to
stop, and a second server beside it would fork the streams: `up` refuses to start, naming it
(``StoreInUse``; docs/decisions/0136-a-store-is-found-by-what-runs-on-it.md). nats-server takes
no lock on its store, so it is found by what the kernel says of each process: its command line
resolved against its working directory, and its open files.

An announcement (``natsregistry.announce``) of a server that is gone: it names the server's pid, so
a client skips it (``announced_credentials``) rather than taking that data dir's credentials to
whatever listens on the port now, and the next `up` removes it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

from services.runtime.datadir import alive, command_line, stop_process
from services.runtime.nats.registry import registry_dir, registry_entry
from services.runtime.nats.server import PID_FILE, EmbeddedNatsServer
from services.runtime.settings.errors import ConfigError

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
    """Whether ``pid`` is a nats-server started as `up` starts one with ``config`` (its absolute
    path): one an `up` left behind."""
    argv = command_line(pid)
    if not argv or not Path(argv[0]).name.startswith("nats-server"):
        return False
    return str(config) in argv or " ".join(argv).endswith(f" {config}")


class StoreInUse(ConfigError):
    """A process `up` did not start uses the store: a second server would fork the streams."""

    def __init__(self, data_dir: Path, found: dict[int, str]) -> None:
        self.pids = sorted(found)
        who = "; ".join(f"pid {pid} ({found[pid]})" for pid in self.pids)
        super().__init__(
            f"{data_dir} is in use by a process egress-proxies did not start: {who}. Stop it "
            "(kill PID), then run `up` again, or choose another --data-dir"
        )


def _config_arguments(argv: list[str]) -> list[str]:
    """What ``-c``/``--config`` name on a nats-server command line, in any of its spellings."""
    found = []
    for i, arg in enumerate(argv[1:], start=1):
        flag, eq, value = arg.partition("=")
        if flag in ("-c", "--c", "-config", "--config"):
            if eq:
                found.append(value)
            elif i + 1 < len(argv):
                found.append(argv[i + 1])
    return found


def _resolved(path: str, pid: int) -> Path | None:
    """``path`` as process ``pid`` opens it: a relative one from its working directory."""
    try:
        base = Path(os.readlink(f"/proc/{pid}/cwd"))
        return (base / path).resolve()
    except (OSError, RuntimeError):
        return None


def _open_files(pid: int) -> Iterator[Path]:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            if target.startswith("/"):
                yield Path(target)


def _pids() -> list[int]:
    try:
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []  # no /proc: the pid file and the announcements are all there is


def on_store(server: EmbeddedNatsServer) -> dict[int, str]:
    """Every live process but this one that uses ``server``'s store, and how it was found: a
    nats-server whose configuration, resolved from its working directory, is the data dir's, or
    any process with a file under the data dir's JetStream store (or its configuration) open."""
    config = server.config_file.resolve()
    store = (server.data_dir / "jetstream").resolve()
    found: dict[int, str] = {}
    for pid in _pids():
        if pid == os.getpid():
            continue
        argv = command_line(pid)
        if argv and Path(argv[0]).name.startswith("nats-server"):
            for given in _config_arguments(argv):
                if _resolved(given, pid) == config:
                    found[pid] = f"nats-server -c {given}"
        if pid in found:
            continue
        for path in _open_files(pid):
            if path == config or path.is_relative_to(store):
                found[pid] = f"has {path} open"
                break
    return {pid: how for pid, how in found.items() if alive(pid)}


def foreign(server: EmbeddedNatsServer) -> dict[int, str]:
    """The processes on the store that `up` may not stop: all of ``on_store`` but the
    nats-servers an `up` left (``serves``)."""
    config = server.config_file
    return {pid: how for pid, how in on_store(server).items() if not serves(pid, config)}


def refuse_foreign(server: EmbeddedNatsServer) -> None:
    """Raise ``StoreInUse`` if a process `up` did not start uses the store; nothing changed."""
    found = foreign(server)
    if found:
        raise StoreInUse(server.data_dir, found)


async def stop_leftovers(server: EmbeddedNatsServer) -> list[int]:
    """Stop every nats-server an `up` left running on ``server``'s store, and remove every
    announcement of its data dir; returns the pids stopped. Refuses (``StoreInUse``, before
    stopping anything) when another process uses the store. Call it holding the data dir's
    lock, before ``server.start()``."""
    config = server.config_file
    refuse_foreign(server)
    stopped = []
    listed = _pid_file(server.data_dir / PID_FILE) + _announced(server) + list(on_store(server))
    for pid in sorted(set(listed)):
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
