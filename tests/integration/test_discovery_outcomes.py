"""Outcome reports steer selection, on two discovery replicas and a real nats-server: a blocked
report on one replica is honoured by an acquire on the other, the back-off doubles and a success
ends it, ``Retry-After`` counts it, the proxy's page shows it, and a restart of every replica
keeps it (it is state in the log, not in a replica)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import datetime

import httpx
import pytest

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

BACKOFF = 100.0
SHOP = "shop.example"
Pair = tuple[httpx.AsyncClient, httpx.AsyncClient]


@pytest.fixture
async def proxies(jetstream_store: JetStreamEventStore) -> list[str]:
    uids = ["p1", "p2"]
    for uid in uids:
        await ready_proxy(jetstream_store, uid, {"pool": "a"})
    return uids


async def replicas(url: str, stack: AsyncExitStack) -> Pair:
    clients = []
    for _ in range(2):
        _, base = await stack.enter_async_context(discovery(url, block_backoff=BACKOFF))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=base, timeout=10))

        async def seen(c: httpx.AsyncClient = client) -> bool:
            return len((await c.get("/v1/proxies")).json()["items"]) == 2

        await until(seen, what="both proxies on the replica")
        clients.append(client)
    return clients[0], clients[1]


@pytest.fixture
async def pair(nats_server: EmbeddedNatsServer, proxies: list[str]) -> AsyncIterator[Pair]:
    del proxies
    async with AsyncExitStack() as stack:
        yield await replicas(nats_server.url, stack)


async def lease(client: httpx.AsyncClient, **body: object) -> httpx.Response:
    return await client.post("/v1/leases", json={"selector": {"pool": "a"}, **body})


async def block(client: httpx.AsyncClient, uid: str, outcome: str = "blocked") -> None:
    """Lease ``uid``, report ``outcome`` for the shop, release it."""
    got = await lease(client, proxyUid=uid)
    assert got.status_code == 201, got.text
    lease_id = got.json()["id"]
    said = await client.post(
        f"/v1/leases/{lease_id}/report",
        json={"outcome": outcome, "target": "https://shop.example/page/1", "detail": "HTTP 403"},
    )
    assert said.status_code == 204, said.text
    assert (await client.delete(f"/v1/leases/{lease_id}")).status_code == 204


async def backoffs(client: httpx.AsyncClient, uid: str) -> list[dict[str, object]]:
    detail = (await client.get(f"/v1/proxies/{uid}")).json()
    shown: list[dict[str, object]] = detail["backoffs"]
    return shown


def seconds_left(backoff: dict[str, object]) -> float:
    until_ = datetime.fromisoformat(str(backoff["until"]))
    return (until_ - datetime.now(until_.tzinfo)).total_seconds()


async def test_a_block_on_one_replica_steers_an_acquire_on_the_other(pair: Pair) -> None:
    a, b = pair
    await block(a, "p1")
    for _ in range(6):  # every grant for the shop is p2, on either replica
        for client in (b, a):
            got = await lease(client, target=SHOP)
            assert got.status_code == 201, got.text
            assert got.json()["proxy"]["uid"] == "p2"
            assert (await client.delete(f"/v1/leases/{got.json()['id']}")).status_code == 204
    for _ in range(2):  # another target may have either: both free, one after the other
        got = await lease(b, target="other.example", exclude=["p2"])
        assert got.json()["proxy"]["uid"] == "p1", got.text
        assert (await b.delete(f"/v1/leases/{got.json()['id']}")).status_code == 204
    held = await lease(b, target=SHOP, proxyUid="p1")
    assert held.status_code == 503
    assert held.json()["error"] == "no_proxy_available"
    assert "in back-off for the target" in held.json()["message"]
    assert BACKOFF - 10 < int(held.headers["Retry-After"]) <= BACKOFF


async def test_the_back_off_doubles_shows_and_a_success_ends_it(pair: Pair) -> None:
    a, b = pair
    await block(a, "p1")
    [first] = await backoffs(b, "p1")
    assert (first["target"], first["blocks"]) == (SHOP, 1)
    assert BACKOFF - 10 < seconds_left(first) <= BACKOFF
    await block(b, "p1")
    [second] = await backoffs(a, "p1")
    assert second["blocks"] == 2
    assert 2 * BACKOFF - 10 < seconds_left(second) <= 2 * BACKOFF
    listed = {p["uid"]: p for p in (await a.get("/v1/proxies")).json()["items"]}
    assert listed["p1"]["backoffCount"] == 1
    assert listed["p1"]["reports"] == {"success": 0, "blocked": 2, "failed": 0, "failedStreak": 0}
    assert listed["p2"]["backoffCount"] == 0
    await block(a, "p1", outcome="success")
    assert await backoffs(b, "p1") == []
    got = await lease(b, target=SHOP, proxyUid="p1")
    assert got.status_code == 201, got.text


async def test_every_replica_restarted_keeps_the_back_off(
    nats_server: EmbeddedNatsServer, proxies: list[str]
) -> None:
    del proxies
    async with AsyncExitStack() as stack:
        a, _ = await replicas(nats_server.url, stack)
        await block(a, "p1")
        before = await backoffs(a, "p1")
    async with AsyncExitStack() as stack:  # every replica stopped, new ones started
        a, b = await replicas(nats_server.url, stack)
        assert await backoffs(a, "p1") == before == await backoffs(b, "p1")
        got = await lease(b, target=SHOP)
        assert got.json()["proxy"]["uid"] == "p2"


async def test_a_target_that_names_no_host_is_refused(pair: Pair) -> None:
    a, _ = pair
    got = await lease(a, target="http://")
    assert got.status_code == 400
    assert got.json()["message"].startswith("target:")
