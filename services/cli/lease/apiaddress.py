"""Where `up`'s discovery API listens, announced in its data dir, and the ``lease`` commands'
``--api-url`` that finds it there.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click

from services.cli.envoptions import with_env_option
from services.cli.lease.api_client import DEFAULT_API_URL
from services.cli.pure.render import clean
from services.runtime.bearer import TOKEN_ENV
from services.runtime.datadir import alive

F = TypeVar("F", bound=Callable[..., Any])

API_FILE = "discovery-api.json"
ANY_ADDRESS = ("0.0.0.0", "::", "")


def default_data_dir() -> Path:
    """The data dir a command that has no ``--data-dir`` uses: ``DATA_DIR``, else ``.data``, as
    ``up`` and the NATS credentials (services/runtime/nats/connection.py) do."""
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
    scratch.unlink(missing_ok=True)
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps({"url": url, "pid": os.getpid()}))
    scratch.replace(path)
    return path


def withdraw(path: Path) -> None:
    """Remove this process's announcement (a later `up` may have written its own: keep that)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


def announced(data_dir: Path) -> str | None:
    """The URL the `up` running on ``data_dir`` serves its API at; None when there is none.

    A file another user owns, or one others may write, is not believed: the command sends its
    ``DISCOVERY_TOKEN`` to the URL it names."""
    path = data_dir / API_FILE
    try:
        seen = path.stat()
        if seen.st_uid != os.getuid() or seen.st_mode & 0o022:
            return None
        found = json.loads(path.read_text())
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


def _api_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    example = f"e.g. {DEFAULT_API_URL}"
    if value is None:
        # Neither flag nor variable: the API of the `up` running on the data dir, as the NATS
        # credentials are found (docs/decisions/0147-the-cli-as-one-language.md).
        return announced(default_data_dir()) or DEFAULT_API_URL
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (parsing the port is what checks it)
        if parts.hostname:
            parts.hostname.encode("idna")
    except ValueError as exc:  # UnicodeError is one: a host name IDNA cannot encode
        raise click.BadParameter(
            f"{value!r} is not a usable URL ({clean(exc)}); {example}"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise click.BadParameter(f"{value!r} is not an http(s) URL, {example}")
    return value.rstrip("/")


def api_options(f: F) -> F:
    f = click.option(
        "-o",
        "--output",
        type=click.Choice(["table", "json"]),
        default="table",
        help="table for people, json for scripts.",
    )(f)
    return with_env_option(
        "--api-url",
        env="DISCOVERY_URL",
        default=None,
        metavar="URL",
        callback=_api_url,
        help="The discovery API; by default the one of the `up` running on the data dir "
        f"(DATA_DIR, else .data), else {DEFAULT_API_URL} (the token comes from {TOKEN_ENV}).",
    )(f)
