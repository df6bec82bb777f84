"""Waiting for a proxy (``waitSeconds``) on real discovery replicas and a real nats-server: a
release, the end of a cooldown or back-off, and a proxy turning healthy each hand the proxy to a
waiting request; requests of one replica are served in arrival order; across replicas no proxy is
ever held twice; a wait that ends empty answers 503 with the real time until a proxy is free."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial

import httpx
import pytest

from services.discovery.service import DiscoveryService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy, set_health
from tests.support.waiting import until

pytestmark = pytest.mark.integration

SELECTOR = {"pool": "w"}


async def lease(client: httpx.AsyncClient, holder: str = "", **body: object) -> httpx.Response:
    return await client.post(
        "/v1/leases", json={"selector": SELECTOR, "ttlSeconds": 600, "holder": holder, **body}
    )


async def release(client: httpx.AsyncClient, response: httpx.Response) -> None:
    assert response.status_code == 201, response.text
    assert (await client.delete(f"/v1/leases/{response.json()['id']}")).status_code == 204


def waiting(service: DiscoveryService) -> int:
    assert service.api is not None
    return service.api.leases.queue.waiting


def queued(service: DiscoveryService, n: int) -> bool:
    return waiting(service) == n


@pytest.fixture
async def one_proxy(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> AsyncIterator[tuple[DiscoveryService, httpx.AsyncClient]]:
    await ready_proxy(jetstream_store, "w1", SELECTOR)
    async with (
        discovery(nats_server.url) as (service, base),
        httpx.AsyncClient(base_url=base, timeout=30) as client,
    ):
        await until(lambda: service.api is not None and service.api.views.proxy("w1") is not None)
        yield service, client


async def test_a_release_hands_the_proxy_to_the_waiting_request(
    one_proxy: tuple[DiscoveryService, httpx.AsyncClient],
) -> None:
    service, client = one_proxy
    held = await lease(client, "first")
    waiter = asyncio.create_task(lease(client, "second", waitSeconds=30))
    await until(lambda: waiting(service) == 1, what="the request to wait")
    await release(client, held)
    got = await waiter
    assert got.status_code == 201, got.text
    assert got.json()["holder"] == "second"
    assert got.json()["fencingToken"] > held.json()["fencingToken"]  # the next lease
    assert waiting(service) == 0


async def test_waiting_requests_of_one_replica_are_served_in_arrival_order(
    one_proxy: tuple[DiscoveryService, httpx.AsyncClient],
) -> None:
    service, client = one_proxy
    held = await lease(client, "holder")
    tasks = []
    for n in range(5):
        tasks.append(asyncio.create_task(lease(client, f"w{n}", waitSeconds=30)))
        await until(partial(queued, service, n + 1), what=f"request {n} to wait")
    order = []
    current = held
    for _ in range(5):
        await release(client, current)
        done, _ = await asyncio.wait(
            [t for t in tasks if not t.done()], return_when=asyncio.FIRST_COMPLETED
        )
        assert len(done) == 1
        current = done.pop().result()
        order.append(current.json()["holder"])
    await release(client, current)
    assert order == [f"w{n}" for n in range(5)]


async def test_a_wait_that_ends_empty_says_when_the_proxy_is_free(
    one_proxy: tuple[DiscoveryService, httpx.AsyncClient],
) -> None:
    service, client = one_proxy
    held = await lease(client, "holder", ttlSeconds=120)
    got = await lease(client, "late", waitSeconds=0.3)
    assert got.status_code == 503
    assert got.json()["error"] == "no_proxy_available"
    assert 110 < int(got.headers["Retry-After"]) <= 120
    assert waiting(service) == 0
    await release(client, held)


async def test_nothing_to_wait_for_is_answered_at_once(
    one_proxy: tuple[DiscoveryService, httpx.AsyncClient],
) -> None:
    _, client = one_proxy
    got = await client.post("/v1/leases", json={"selector": {"pool": "x"}, "waitSeconds": 60})
    assert (got.status_code, got.json()["error"]) == (422, "no_matching_proxy")
    for wait in (-1, 61, "5"):
        bad = await client.post("/v1/leases", json={"waitSeconds": wait})
        assert bad.status_code == 400, wait
        assert "waitSeconds" in bad.json()["message"]


async def test_the_end_of_a_cooldown_and_of_a_back_off_wake_a_waiting_request(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    """No event marks either end: the queue wakes at the time the view says."""
    await ready_proxy(jetstream_store, "w1", SELECTOR)
    async with (
        discovery(nats_server.url, lease_cooldown=1.0, block_backoff=1.0) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=30) as client,
    ):
        held = await lease(client, "a")
        await release(client, held)
        got = await lease(client, "b", waitSeconds=20)  # cooling down for 1 s
        assert got.status_code == 201, got.text
        said = await client.post(
            f"/v1/leases/{got.json()['id']}/report",
            json={"outcome": "blocked", "target": "shop.example"},
        )
        assert said.status_code == 204
        await release(client, got)
        again = await lease(client, "c", target="shop.example", waitSeconds=20)
        assert again.status_code == 201, again.text
        tokens = [r.json()["fencingToken"] for r in (held, got, again)]
        assert tokens == sorted(set(tokens))  # three leases, one after the other
        await release(client, again)


async def test_a_proxy_turning_healthy_wakes_a_waiting_request(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "w1", SELECTOR, healthy=False)
    async with (
        discovery(nats_server.url) as (service, base),
        httpx.AsyncClient(base_url=base, timeout=30) as client,
    ):
        waiter = asyncio.create_task(lease(client, "patient", waitSeconds=30))
        await until(lambda: waiting(service) == 1, what="the request to wait")
        await set_health(jetstream_store, "w1", True)
        got = await waiter
        assert got.status_code == 201, got.text
        await release(client, got)


async def test_across_replicas_no_proxy_is_ever_held_twice(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    for uid in ("w1", "w2"):
        await ready_proxy(jetstream_store, uid, SELECTOR)
    holding: dict[str, str] = {}
    overlaps: list[str] = []
    async with (
        discovery(nats_server.url) as (_, first),
        discovery(nats_server.url) as (_, second),
        httpx.AsyncClient(base_url=first, timeout=30) as a,
        httpx.AsyncClient(base_url=second, timeout=30) as b,
    ):

        async def crawler(n: int, client: httpx.AsyncClient) -> int:
            got = 0
            for _ in range(4):
                response = await lease(client, f"c{n}", waitSeconds=30)
                assert response.status_code == 201, response.text
                uid = response.json()["proxy"]["uid"]
                if uid in holding:
                    overlaps.append(f"{uid}: {holding[uid]} and c{n}")
                holding[uid] = f"c{n}"
                await asyncio.sleep(0.02)
                del holding[uid]
                await release(client, response)
                got += 1
            return got

        grants = await asyncio.gather(*(crawler(n, (a, b)[n % 2]) for n in range(8)))
    assert overlaps == []
    assert sum(grants) == 32


async def test_after_an_early_release_retry_after_is_the_cooldown_not_the_ttl(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "w1", SELECTOR)
    async with (
        discovery(nats_server.url, lease_cooldown=30.0) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=30) as client,
    ):
        held = await lease(client, "a", ttlSeconds=3600)
        busy = await lease(client, "b")
        assert 3600 < int(busy.headers["Retry-After"]) <= 3630  # the end, then the cooldown
        await release(client, held)
        cooling = await lease(client, "b")
        assert cooling.status_code == 503
        assert 20 < int(cooling.headers["Retry-After"]) <= 30
