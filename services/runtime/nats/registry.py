"""Where this machine's embedded servers tell this user's clients where their credentials are.

Why a registry: a client given only ``nats://127.0.0.1:PORT`` (the CLI, or ``run``, started from
any directory) must log in without a password on its command line. Each server announces its
credentials file under its port, and a client looks the port up (``connection.local_users``); an
entry whose server is gone is told by its pid (``nats.stale``).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import structlog

from services.runtime.nats.credentials import write_private

log = structlog.get_logger("egress.nats-server")


def registry_dir() -> Path:
    """Where this machine's embedded servers tell this user's clients where their credentials
    are, by port: a client then finds them from any directory."""
    base = os.environ.get("XDG_RUNTIME_DIR") or str(Path.home() / ".cache")
    return Path(base) / "egress-proxies"


def registry_entry(port: int) -> Path:
    return registry_dir() / f"nats-{port}.json"


def announce(port: int, credentials: Path, pid: int | None = None) -> None:
    """The server's pid tells a reader when the entry is stale (``nats.stale``)."""
    try:
        folder = registry_dir()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if folder.stat().st_uid != os.getuid():
            return
        entry = {"credentials": str(credentials), "pid": pid}
        write_private(registry_entry(port), json.dumps(entry) + "\n")
    except OSError as exc:
        log.debug("cannot announce the embedded nats-server", error=str(exc))


def withdraw(port: int, credentials: Path) -> None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        entry = registry_entry(port)
        if json.loads(entry.read_text())["credentials"] == str(credentials):
            entry.unlink()
