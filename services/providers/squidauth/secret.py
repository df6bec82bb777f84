"""The master lease secret: where the services find it, and how ``up`` makes one.

Read from the environment only, like ``DISCOVERY_TOKEN``: a secret on a command line shows in
``ps``. ``EGRESS_LEASE_SECRET`` holds the secret itself, ``EGRESS_LEASE_SECRET_FILE`` names a file
holding it (a mounted Kubernetes Secret); setting both is a mistake. The executor (which hands
each instance its proxy key), discovery (which mints lease credentials) and health (which probes
with its own) must all see the same secret (docs/decisions/0084-leases-enforced-at-the-proxy.md).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from services.providers.squidauth.pure.scheme import MIN_SECRET_BYTES
from services.runtime.settings.errors import ConfigError

SECRET_ENV = "EGRESS_LEASE_SECRET"
SECRET_FILE_ENV = "EGRESS_LEASE_SECRET_FILE"
SECRET_FILE_NAME = "lease-secret"
"""What ``up`` keeps in its data directory."""
HOW = (
    f"set {SECRET_ENV} (e.g. `openssl rand -hex 32`) or {SECRET_FILE_ENV} (a file holding it) "
    "for the executor, discovery and health alike"
)


def master_secret_from_env(env: Mapping[str, str] | None = None) -> bytes | None:
    """The master secret, or None when neither variable is set. Raises ``ConfigError`` for a
    secret too short to be one, an unreadable file, or both variables set."""
    env = os.environ if env is None else env
    value = env.get(SECRET_ENV, "").strip()
    path = env.get(SECRET_FILE_ENV, "").strip()
    if value and path:
        raise ConfigError(f"{SECRET_ENV} and {SECRET_FILE_ENV} are both set; set one of them")
    where = SECRET_ENV
    if path:
        where = f"{SECRET_FILE_ENV} {path}"
        try:
            value = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read the lease secret ({exc}); {HOW}") from exc
    if not value:
        if path:
            raise ConfigError(f"{where} is empty; {HOW}")
        return None
    secret = value.encode()
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{where}: the lease secret has {len(secret)} bytes, fewer than {MIN_SECRET_BYTES}; "
            "use a random one, e.g. `openssl rand -hex 32`"
        )
    return secret


def ensure_secret_file(data_dir: Path) -> Path:
    """``data_dir``'s lease secret, made (random, mode 0600) if it does not exist yet; kept
    across restarts, so the proxies ``up`` started before still accept its leases."""
    path = data_dir / SECRET_FILE_NAME
    if path.exists():
        return path
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path  # another `up` on the same directory made it first
    with os.fdopen(fd, "w", encoding="ascii") as file:
        file.write(secrets.token_hex(32) + "\n")
    return path


LEASE_SECRET_VARIABLES = (SECRET_ENV, SECRET_FILE_ENV)
"""Read by the executor, discovery and health, named by their settings Structs (``reads_env``)
so that their commands declare them: ``--help`` of none shows them (no flag), and no settings
object holds the secret; ``master_secret_from_env`` reads it when the service is built."""
