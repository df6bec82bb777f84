"""A replica whose lease view lags does not answer ``unknown_lease`` for a lease another replica
has just granted: before it says a lease id is unknown, it waits (bounded) for its view to reach
the LEASE stream's last sequence. The lag is made real by holding the replica's projector."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from nats.aio.msg import Msg

from services.discovery.service import DiscoveryService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration


def hold_lease_view(service: DiscoveryService, gate: asyncio.Event) -> asyncio.Task[None]:
    """The replica's lease view applies nothing until ``gate`` is set: what its push follower
    delivers meanwhile is kept, then applied in order."""
    assert service.api is not None
    push = service.api.views.leases.push
    assert push is not None  # the replica follows the log by push
    apply = push.on_msg
    held: list[Msg] = []

    def holding(msg: Msg) -> None:
        if gate.is_set() and not held:
            apply(msg)
        else:
            held.append(msg)

    async def release() -> None:
        await gate.wait()
        for msg in held:
            apply(msg)
        held.clear()

    push.on_msg = holding
    return asyncio.create_task(release())


async def test_a_lease_from_another_replica_is_found_once_the_view_catches_up(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    gate = asyncio.Event()
    async with (
        discovery(nats_server.url) as (_, first),
        discovery(nats_server.url) as (lagging, second),
        httpx.AsyncClient(base_url=first, timeout=10) as a,
        httpx.AsyncClient(base_url=second, timeout=10) as b,
    ):
        held = hold_lease_view(lagging, gate)
        assert lagging.api is not None
        views = lagging.api.views
        got = await a.post("/v1/leases", json={"ttlSeconds": 60})
        assert got.status_code == 201, got.text
        lease_id = got.json()["id"]
        assert views.find_lease(lease_id) is None  # the replica has not seen it
        asked = asyncio.create_task(b.get(f"/v1/leases/{lease_id}"))
        await asyncio.sleep(0.3)
        assert not asked.done()  # waiting for its view, not answering 404
        gate.set()
        await held
        shown = await asked
        assert shown.status_code == 200, shown.text
        assert shown.json()["id"] == lease_id
        await until(lambda: views.find_lease(lease_id) is not None)
        never = await b.get("/v1/leases/00000000-0000-0000-0000-000000000000")
        assert (never.status_code, never.json()["error"]) == (404, "unknown_lease")


async def test_a_proxy_released_on_another_replica_is_granted_not_refused(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    """A crawler that releases on one replica and acquires on another at once gets the proxy it
    freed: the lagging replica reaches the log's end before it would answer 503."""
    await ready_proxy(jetstream_store, "p1")
    gate = asyncio.Event()
    async with (
        discovery(nats_server.url) as (_, first),
        discovery(nats_server.url) as (lagging, second),
        httpx.AsyncClient(base_url=first, timeout=10) as a,
        httpx.AsyncClient(base_url=second, timeout=10) as b,
    ):
        assert lagging.api is not None
        views = lagging.api.views
        got = await a.post("/v1/leases", json={"ttlSeconds": 60})
        assert got.status_code == 201, got.text
        await until(lambda: views.find_lease(got.json()["id"]) is not None)
        held = hold_lease_view(lagging, gate)
        assert (await a.delete(f"/v1/leases/{got.json()['id']}")).status_code == 204
        asked = asyncio.create_task(b.post("/v1/leases", json={"ttlSeconds": 60}))
        await asyncio.sleep(0.3)
        assert not asked.done()  # reaching the log's end, not answering 503
        gate.set()
        await held
        taken = await asked
        assert taken.status_code == 201, taken.text
        assert taken.json()["proxy"]["uid"] == "p1"
        again = await b.post("/v1/leases", json={"ttlSeconds": 60})
        assert (again.status_code, again.json()["error"]) == (503, "no_proxy_available")
