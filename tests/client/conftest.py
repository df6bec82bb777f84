"""A discovery replica on a real nats-server, with two Ready and healthy proxies in its log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

import httpx
import pytest

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy
from tests.support.waiting import until

UIDS = ("client-1", "client-2")
ATTRIBUTES = {"country": "de"}
TOKEN = "client-test-token"


async def available(api: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=api, headers=headers) as client:
        items = (await client.get("/v1/proxies")).json()["items"]
    return sum(1 for p in items if p["available"])


async def fleet(store: JetStreamEventStore) -> None:
    for uid in UIDS:
        await ready_proxy(store, uid, ATTRIBUTES)


@pytest.fixture
async def api(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> AsyncIterator[str]:
    """The replica's base URL, once it can lease both proxies."""
    await fleet(jetstream_store)
    async with discovery(nats_server.url) as (_, url):
        await until(lambda: _all(url), what="both proxies available")
        yield url


@pytest.fixture
async def guarded_api(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> AsyncIterator[str]:
    """The same, with ``DISCOVERY_TOKEN`` set to ``TOKEN``."""
    await fleet(jetstream_store)
    async with discovery(nats_server.url, token=TOKEN) as (_, url):
        await until(partial(_all, url, TOKEN), what="both proxies available")
        yield url


async def _all(api: str, token: str | None = None) -> bool:
    return await available(api, token) == len(UIDS)
