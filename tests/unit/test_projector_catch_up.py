"""catch_up's stopping rule, against a reader that behaves as nats-server was seen to behave.

Under load, a fetch can give up just before the server's "request timeout" status arrives; the
status then sits in the local queue, which a fetch drains and discards. Counted as a message, it
kept catch_up fetching for ever (the queue refilled with each fetch's own late status). This
reader leaves such a status queued after every fetch; catch_up must still end.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from nats.aio.msg import Msg

from projections.proxy import ProxyView, apply
from services.runtime.eventlog.projector import Projector


class LateStatusReader:
    """Nothing left on the server; one status message queued after every fetch."""

    def __init__(self) -> None:
        self.last_seq = 0
        self.num_pending = 0
        self.batch = 100
        self.fetches: list[float] = []

    async def fetch(self, timeout: float) -> list[Msg]:
        self.fetches.append(timeout)
        await asyncio.sleep(0)  # a real fetch yields; so the test's timeout can fire
        return []

    async def pending(self) -> int:
        server, queued = await self.pending_parts()
        return server + queued

    async def pending_parts(self) -> tuple[int, int]:
        return 0, 1

    async def close(self) -> None:
        return None


async def test_a_queued_status_message_does_not_keep_catch_up_going() -> None:
    projector: Projector[ProxyView] = Projector(cast(Any, None), "PROXY", "proxy.*.*", apply)
    reader = LateStatusReader()
    projector._reader = cast(Any, reader)
    async with asyncio.timeout(5):
        assert await projector.catch_up() == 0
    # One short fetch, then one full one that gives late messages time to arrive.
    assert reader.fetches == [0.05, projector.idle_timeout]
