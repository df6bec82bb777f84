"""The NATS connection every service holds, and whom it logs in as.

Reconnects forever (a service outlives a nats-server restart) and counts reconnections, so a
consumer loop can rebuild its pull subscription afterwards: nats-py's pull subscriptions stop
receiving after a server restart (nats-py issue 504).

The URL may be a comma-separated list, the servers of one cluster: nats-py gets them all, connects
to one at random and reconnects to another when that one dies.

Credentials come from the URL (``nats://user:password@host``), else from ``NATS_USER`` /
``NATS_PASSWORD``, else, for a server on this machine, from what ``egress-proxies up`` wrote for
its embedded server: so the CLI next to a running ``up`` needs no flags.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats.errors
import structlog
from nats.js import JetStreamContext

from services.runtime.nats.client import Client as NATS
from services.runtime.nats.credentials import CREDENTIALS_FILE, read_users
from services.runtime.nats.server import DEFAULT_PORT
from services.runtime.nats.stale import announced_credentials
from services.runtime.nats.users import ADMIN
from services.runtime.settings.shared import (
    Credentials,
    redact_url,
    split_urls,
    url_has_credentials,
)

log = structlog.get_logger("egress.nats")

REPEAT_EVERY = 30.0
"""While a server stays down, the same connection error is logged once per this many seconds
(nats-py reports every reconnect attempt, twice a second)."""


class ConnectError(RuntimeError):
    """No nats-server answered at the configured URL, or it refused our credentials."""


@dataclass
class Connection:
    nc: NATS
    js: JetStreamContext
    reconnects: int = 0
    reconnected: asyncio.Event = field(default_factory=asyncio.Event)
    closing: bool = False
    """Set by ``close``: the disconnection that follows is ours, not news for the log."""

    def mark_reconnected(self) -> None:
        """Wake everything waiting on the old connection; later waiters get a fresh event."""
        self.reconnects += 1
        old, self.reconnected = self.reconnected, asyncio.Event()
        old.set()

    async def close(self) -> None:
        """Flush and close. Not ``drain``: nats-py's drain waits out its whole timeout on a pull
        subscription, and nothing here needs draining (unacked messages are redelivered). A
        server that is gone makes nats-py's close raise on the dead socket, and a flush wait for
        it: a stop must do neither."""
        if self.nc.is_closed:
            return
        self.closing = True
        if self.nc.is_connected:
            with contextlib.suppress(nats.errors.Error, TimeoutError, OSError):
                await self.nc.flush(timeout=2)
        with contextlib.suppress(nats.errors.Error, TimeoutError, OSError):
            await self.nc.close()


def is_local(url: str) -> bool:
    """Whether ``url``, or every URL of a comma-separated list, names a loopback address."""
    urls = split_urls(url)
    return bool(urls) and all(_is_loopback(item) for item in urls)


def _is_loopback(url: str) -> bool:
    try:
        host = urlsplit(url).hostname or ""
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_users(url: str) -> dict[str, str]:
    """The users of this user's embedded server behind ``url``: the one that announced itself
    on that port (for a list, on the first port that has an announcement: a local cluster's
    servers share their users), else the one under ``$DATA_DIR`` (default ``.data``, as ``up``)."""
    for item in split_urls(url):
        try:
            port = urlsplit(item).port or DEFAULT_PORT
        except ValueError:
            continue
        # A dead server's entry is skipped (docs/decisions/0094-one-data-dir-one-up-one-nats.md).
        credentials = announced_credentials(port)
        users = read_users(credentials) if credentials is not None else {}
        if users:
            return users
    return read_users(Path(os.environ.get("DATA_DIR") or ".data") / "nats" / CREDENTIALS_FILE)


def credentials_for(
    url: str, explicit: Credentials | None = None, user: str = ADMIN
) -> Credentials | None:
    """Whom to log in as at ``url``; None leaves it to the URL (or to no authentication).

    Local credentials are sent only to a loopback address (for a list, only when every server is
    on one): a remote server must never learn them.
    ``user`` is the process's own user there (a service's name); the admin stands in for one
    the server does not know.
    """
    if url_has_credentials(url):
        return None
    if explicit is not None:
        return explicit
    if not is_local(url):
        return None
    users = local_users(url)
    name = user if user in users else ADMIN
    return Credentials(name, users[name]) if name in users else None


def _refused(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "authorization" in text or "authentication" in text


def connect_failure(
    url: str, credentials: Credentials | None, raised: BaseException, seen: list[Exception]
) -> str:
    """One line saying what went wrong, naming the user but never a password. A refused login
    wins over what the retries ran into afterwards (the server drops the connection)."""
    where = redact_url(url)
    cause = next((e for e in seen if _refused(e)), seen[-1] if seen else raised)
    text = str(cause) or type(cause).__name__
    if _refused(cause):
        parts = urlsplit((split_urls(url) or [""])[0])
        user = credentials.user if credentials else parts.username
        if user and not credentials and parts.password is None:
            who = "a token"
        else:
            who = f"user {user!r}" if user else "no credentials"
        return (
            f"nats-server at {where} refused the login ({who}): {text}. Put user:password in "
            "--nats-url / NATS_URL, or set NATS_USER and NATS_PASSWORD (next to `egress-proxies "
            "up`, its credentials are found on their own)"
        )
    return (
        f"cannot reach nats-server at {where}: {text}. Start one (`egress-proxies up` embeds "
        "one) or set --nats-url / NATS_URL"
    )


async def connect(
    url: str,
    *,
    name: str = "egress-proxies",
    connect_timeout: float = 5.0,
    credentials: Credentials | None = None,
    user: str = ADMIN,
) -> Connection:
    """``credentials`` win over the local lookup for ``user`` (see ``credentials_for``)."""
    holder: list[Connection] = []
    login = credentials_for(url, credentials, user)
    where = redact_url(url)
    seen: list[Exception] = []
    last: dict[str, float] = {}

    async def disconnected() -> None:
        if holder and holder[0].closing:
            log.debug("nats connection closed", url=where)
            return
        log.warning("nats disconnected", url=where)

    async def reconnected() -> None:
        last.clear()
        if holder:
            holder[0].mark_reconnected()
        log.info("nats reconnected", url=where)

    async def error(exc: Exception) -> None:
        if not seen or not _refused(seen[0]):
            seen[:] = [exc]
        text, now = str(exc), asyncio.get_running_loop().time()
        if now - last.get(text, -REPEAT_EVERY) >= REPEAT_EVERY:
            last[text] = now
            log.warning("nats error", error=text)

    # nats-py types its timeouts as int; they are floats at heart, hence the untyped options.
    options: dict[str, Any] = {"reconnect_time_wait": 0.5, "connect_timeout": connect_timeout}
    nc = NATS()
    try:
        # Reconnect forever once connected, but give up on the first connection: nats-py would
        # otherwise retry it forever too, and a service would hang silently at start-up.
        async with asyncio.timeout(connect_timeout * 2):
            await nc.connect(
                servers=split_urls(url),
                name=name,
                max_reconnect_attempts=-1,
                allow_reconnect=True,
                disconnected_cb=disconnected,
                reconnected_cb=reconnected,
                error_cb=error,
                user=login.user if login else None,
                password=login.password if login else None,
                **options,
            )
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        await discard(nc)
        raise ConnectError(connect_failure(url, login, exc, seen)) from exc
    conn = Connection(nc=nc, js=nc.jetstream())
    holder.append(conn)
    return conn


async def discard(nc: NATS) -> None:
    """Close what a failed first connection left open (a refused login leaves its socket)."""
    with contextlib.suppress(nats.errors.Error, TimeoutError, OSError):
        await nc.close()
