"""What the chaos soak reads back: the streams from sequence 1, and whether the fleet works.

The streams are read the way the services read them (an ordered pull from sequence 1, decoded
with ``events.reading``), across nats-server restarts. "Converged" is judged twice: the log must
show every proxy Ready and healthy, and every proxy must really forward a request to the origin.
The log alone is not enough: right after a Squid is killed, nothing has noticed yet, and the
log still says Ready and healthy about a proxy that no longer answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import nats.errors

from bench.chaos_fleet import LEASE_SECRET
from events import reading
from events.errors import EventStoreError
from events.schemas import Phase
from events.store import Recorded
from events.subjects import proxy_uid_of
from projections import proxy
from projections.proxy import ProxyView
from services.health.credentials import LIFETIME_SECONDS as PROBE_LIFETIME
from services.providers.squidauth.pure.scheme import (
    basic_authorization,
    probe_credential,
    proxy_key,
)
from services.runtime.eventlog.ordered import OrderedPull
from services.runtime.nats.connection import Connection

PROBE_TIMEOUT = 3.0


class StreamReader:
    """One stream from sequence 1, in order, exactly once, whatever restarts in between."""

    def __init__(self, conn: Connection, stream: str, filter_subject: str) -> None:
        self.conn = conn
        self.stream = stream
        self._reader = OrderedPull(conn.js, stream, filter_subject)
        self._reconnects = conn.reconnects
        self.target = 0

    @property
    def last_seq(self) -> int:
        return self._reader.last_seq

    @property
    def complete(self) -> bool:
        """Everything up to the stream's last sequence, as of the last ``read_new``, was read."""
        return self.last_seq >= self.target

    async def read_new(self, timeout: float) -> list[Recorded]:
        """What was stored since the last call, up to the stream's last sequence now."""
        out: list[Recorded] = []
        deadline = time.monotonic() + timeout
        try:
            info = await self.conn.js.stream_info(self.stream)
        except (nats.errors.Error, TimeoutError, OSError):
            return out
        self.target = info.state.last_seq or 0
        while self.last_seq < self.target and time.monotonic() < deadline:
            if self.conn.reconnects != self._reconnects:
                # nats-py pull subscriptions go deaf after a reconnection: start over after
                # the last message read.
                self._reconnects = self.conn.reconnects
                await self._reader.restart()
            try:
                msgs = await self._reader.fetch(0.5)
            except (EventStoreError, nats.errors.Error, TimeoutError, OSError):
                await asyncio.sleep(0.2)
                continue
            for msg in msgs:
                meta = msg.metadata
                item, _ = reading.recorded(
                    self.stream,
                    meta.sequence.stream,
                    msg.subject,
                    meta.timestamp,
                    msg.data,
                    msg.headers,
                )
                out.append(item)
        return out

    async def read_all(self, timeout: float) -> list[Recorded]:
        """Everything, or ``RuntimeError``: a check on half the log would find nothing wrong."""
        out = await self.read_new(timeout)
        if not self.complete:
            raise RuntimeError(
                f"read {self.stream} up to {self.last_seq} of {self.target} in {timeout:.0f} s"
            )
        return out

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._reader.close()


def fold_proxies(views: dict[str, ProxyView], events: list[Recorded]) -> None:
    for recorded in events:
        uid = proxy_uid_of(recorded.subject)
        views[uid] = proxy.apply(views.get(uid), recorded)


def serving(view: ProxyView | None) -> bool:
    return (
        view is not None
        and view.phase is Phase.READY
        and view.healthy is True
        and not view.deleting
        and bool(view.url)
    )


def probe_authorization(uid: str) -> str:
    """The prober's credential for proxy ``uid``: the soak's proxies enforce leases."""
    key = proxy_key(LEASE_SECRET.encode(), uid)
    expires = int((time.time() + PROBE_LIFETIME) * 1000)
    return basic_authorization(probe_credential(key, expires))


async def forwards(url: str, origin_port: int, authorization: str = "") -> bool:
    """A GET to the origin through the proxy at ``url`` answers 200."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                target = f"127.0.0.1:{origin_port}"
                request = f"GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n"
                if authorization:
                    request += f"Proxy-Authorization: {authorization}\r\n"
                writer.write(f"{request}Connection: close\r\n\r\n".encode())
                await writer.drain()
                status = await reader.readline()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError):
        return False
    return status.split(b" ")[1:2] == [b"200"]


def describe(view: ProxyView | None) -> str:
    if view is None:
        return "not in the log"
    return f"phase {view.phase.value}, healthy {view.healthy}, {view.reason or 'no reason'}"


async def converge(
    reader: StreamReader,
    views: dict[str, ProxyView],
    applied: Mapping[str, str],
    *,
    origin_port: int,
    deadline: float,
    now: Callable[[], float] = time.time,
) -> tuple[float | None, list[str]]:
    """Poll until every applied proxy is Ready, healthy and forwarding, or until ``deadline``
    (wall clock). Returns when it was first seen so (None if never) and, if never, why not."""
    stragglers: list[str] = []
    while True:
        polled = now()
        fold_proxies(views, await reader.read_new(timeout=2.0))
        stragglers = [
            f"{name}: {describe(views.get(uid))}"
            for uid, name in sorted(applied.items(), key=lambda item: item[1])
            if not serving(views.get(uid))
        ]
        if not stragglers:
            urls = {uid: views[uid].url for uid in applied}
            ok = await asyncio.gather(
                *(forwards(url, origin_port, probe_authorization(uid)) for uid, url in urls.items())
            )
            stragglers = [
                f"{applied[uid]}: Ready and healthy in the log, but {url} does not forward"
                for (uid, url), fine in zip(urls.items(), ok, strict=True)
                if not fine
            ]
            if not stragglers:
                return polled, []
        if now() >= deadline:
            return None, stragglers
        await asyncio.sleep(0.5)
