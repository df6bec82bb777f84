"""Where `up`'s discovery API listens, announced in its data dir for the ``lease`` commands.

The ``lease`` commands find the API the way every other command finds the embedded NATS
server's credentials: from the data dir (``DATA_DIR``, else ``.data``), so ``up --api-port``
needs no second flag on each ``lease`` command. An explicit ``--api-url`` / ``DISCOVERY_URL``
still wins; with neither and no announcement, the default URL is tried
(docs/decisions/0147-the-cli-as-one-language.md).

The file names the process that wrote it: one left by an `up` that was killed is skipped, as a
dead NATS server's announcement is (docs/decisions/0094-one-data-dir-one-up-one-nats.md).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from services.runtime.datadir import alive

API_FILE = "discovery-api.json"
ANY_ADDRESS = ("0.0.0.0", "::", "")


def default_data_dir() -> Path:
    """The data dir a command that has no ``--data-dir`` uses: ``DATA_DIR``, else ``.data``, as
    ``up`` and the NATS credentials (services/runtime/connection.py) do."""
    return Path(os.environ.get("DATA_DIR") or ".data")


def api_url_for(host: str, port: int) -> str:
    """The URL a client on this machine reaches an API listening on ``host:port`` at."""
    if host in ANY_ADDRESS:
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def announce(data_dir: Path, url: str) -> Path:
    """Write where the API listens (replaced whole, so a reader never sees half a file)."""
    path = data_dir / API_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    scratch.replace(path)
    return path


def withdraw(path: Path) -> None:
    """Remove this process's announcement (a later `up` may have written its own: keep that)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


def announced(data_dir: Path) -> str | None:
    """The URL the `up` running on ``data_dir`` serves its API at; None when there is none."""
    try:
        found = json.loads((data_dir / API_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict):
        return None
    url, pid = found.get("url"), found.get("pid")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return None
    if not isinstance(pid, int) or not alive(pid):
        return None
    return url
