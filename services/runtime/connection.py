"""The NATS connection every service shares.

Reconnects forever (a service outlives a nats-server restart) and counts reconnections, so a
consumer loop can rebuild its pull subscription afterwards: nats-py's pull subscriptions stop
receiving after a server restart (nats-py issue 504).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import nats
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

log = structlog.get_logger("egress.nats")


class ConnectError(RuntimeError):
    """No nats-server answered at the configured URL."""


@dataclass
class Connection:
    nc: NATS
    js: JetStreamContext
    reconnects: int = 0
    reconnected: asyncio.Event = field(default_factory=asyncio.Event)

    def mark_reconnected(self) -> None:
        """Wake everything waiting on the old connection; later waiters get a fresh event."""
        self.reconnects += 1
        old, self.reconnected = self.reconnected, asyncio.Event()
        old.set()

    async def close(self) -> None:
        """Flush and close. Not ``drain``: nats-py's drain waits out its whole timeout on a pull
        subscription, and nothing here needs draining (unacked messages are redelivered)."""
        if self.nc.is_closed:
            return
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await self.nc.flush(timeout=2)
        await self.nc.close()


async def connect(
    url: str, *, name: str = "egress-proxies", connect_timeout: float = 5.0
) -> Connection:
    holder: list[Connection] = []

    async def disconnected() -> None:
        log.warning("nats disconnected", url=url)

    async def reconnected() -> None:
        if holder:
            holder[0].mark_reconnected()
        log.info("nats reconnected", url=url)

    async def error(exc: Exception) -> None:
        log.warning("nats error", error=str(exc))

    try:
        # Reconnect forever once connected, but give up on the first connection: nats-py would
        # otherwise retry it forever too, and a service would hang silently at start-up.
        async with asyncio.timeout(connect_timeout * 2):
            nc = await nats.connect(
                servers=[url],
                name=name,
                connect_timeout=connect_timeout,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                allow_reconnect=True,
                disconnected_cb=disconnected,
                reconnected_cb=reconnected,
                error_cb=error,
            )
    except (nats.errors.NoServersError, OSError, TimeoutError) as exc:
        raise ConnectError(
            f"cannot reach nats-server at {url}: {exc}. Start one (`egress-proxies up` embeds "
            "one) or set --nats-url / NATS_URL"
        ) from exc
    conn = Connection(nc=nc, js=nc.jetstream())
    holder.append(conn)
    return conn
