"""The leader's view of the ``PROXY`` stream: the shared proxy fold, kept current by a Projector.

It also remembers, per proxy, which uids changed since the writer last looked and the trace
context of the latest event, so a status patch joins the trace of the change it shows.
"""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from events import codec, subjects
from projections.proxy import ProxyView, apply
from services.runtime.eventlog.projector import Projector

TRACE_HEADERS = (codec.HDR_TRACEPARENT, codec.HDR_TRACESTATE)


class LogView(Projector[ProxyView]):
    def __init__(self, js: JetStreamContext, *, idle_timeout: float = 0.5) -> None:
        super().__init__(js, subjects.PROXY_STREAM, "proxy.>", apply, idle_timeout=idle_timeout)
        self.changed: set[str] = set()
        self.carriers: dict[str, dict[str, str]] = {}
        self.lock = asyncio.Lock()
        """One reader at a time: the writer steps, the watcher's re-list catches up."""

    def _apply(self, msg: Msg) -> None:
        # The Projector's hook for one message; the headers are only visible here.
        super()._apply(msg)
        key = self.key(msg.subject)
        self.changed.add(key)
        headers = msg.headers or {}
        carrier = {h: headers[h] for h in TRACE_HEADERS if h in headers}
        if carrier:
            self.carriers[key] = carrier

    async def sync(self) -> None:
        async with self.lock:
            await self.catch_up()

    async def advance(self) -> int:
        async with self.lock:
            return await self.step()

    def take_changed(self) -> set[str]:
        changed, self.changed = self.changed, set()
        return changed
