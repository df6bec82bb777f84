"""The embedded nats-server's credentials files: the users' passwords and the ``nats`` CLI contexts.

Why files in the data dir: the server and every client of this user on this machine must agree
on the passwords across restarts, and nothing else is shared between them. Every file is this
user's only (0600) and replaced atomically, so a reader never sees half a password.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

from services.runtime.nats.users import USERS
from services.runtime.settings.shared import Credentials

CREDENTIALS_FILE = "credentials.json"
CONTEXT_FILE = "nats-context.json"
READER_CONTEXT_FILE = "nats-reader-context.json"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by this user only (0600), replacing ``path`` atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)


def read_users(path: Path) -> dict[str, str]:
    """The users and passwords of a credentials file; empty if it is missing, unreadable, or not
    this user's own (someone else's file must not decide whom we log in as)."""
    try:
        mine = path.stat().st_uid == os.getuid()
        users = json.loads(path.read_text())["users"] if mine else {}
        return {k: v for k, v in users.items() if isinstance(k, str) and isinstance(v, str) and v}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def ensure_users(path: Path) -> dict[str, str]:
    """Reuse the passwords on file and generate any missing one (a service added since), so a
    restart on the same data dir keeps every client's credentials valid."""
    users = read_users(path)
    missing = [user for user in USERS if user not in users]
    for user in missing:
        users[user] = secrets.token_urlsafe(24)
    if missing or path.stat().st_mode & 0o077:
        write_private(path, json.dumps({"users": users}, indent=2) + "\n")
    return users


def write_context(path: Path, user: str, url: str, creds: Credentials) -> None:
    """A ``nats`` CLI context for ``user``: ``nats --context <path> ...`` asks for no password."""
    context = {"description": f"egress-proxies up ({user})", "url": url}
    context |= {"user": creds.user, "password": creds.password}
    write_private(path, json.dumps(context))
