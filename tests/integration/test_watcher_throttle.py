"""A throttled apiserver is given the pause it asks for: after a 429 with ``Retry-After``, the
watcher's status writer sends nothing until the pause is over, for that proxy or any other, and
then writes every status it owes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.kube import PROXIES
from tests.support.waiting import until
from tests.support.watcher_harness import Bench, bench

pytestmark = pytest.mark.integration

PAUSE = 2


def written(b: Bench, *names: str) -> list[str]:
    return [name for name in names if b.status(name).get("phase")]


async def test_status_writes_wait_for_the_retry_after_of_a_429(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        throttled = b.kube.fail(
            "patch/status",
            PROXIES,
            status=429,
            reason="TooManyRequests",
            message="too many requests, please try again later",
            headers={"Retry-After": str(PAUSE)},
            times=1,
        )
        await b.watcher()  # its retry delay is 0.2 s: without the header it would not wait
        names = ("a", "b", "c")
        for name in names:
            b.create(name)
        await until(lambda: throttled.hits == 1, what="the throttled status patch")
        loop = asyncio.get_running_loop()
        await until(lambda: bool(written(b, *names)), what="a status after the pause")
        first_after = loop.time()
        assert first_after - throttled.hit_at[0] >= PAUSE - 0.1
        await until(lambda: written(b, *names) == list(names), what="every status")
        assert throttled.hits == 1
