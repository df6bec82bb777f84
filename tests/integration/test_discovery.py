"""The discovery API over real HTTP, against a real nats-server: proxies, leases, errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import httpx
import pytest

from events import subjects
from events.jetstream import JetStreamEventStore
from events.schemas import LeaseExpired, LeaseReleased, Phase
from projections.lease import fold as fold_leases
from services.discovery.service import DiscoveryService
from services.runtime.natsserver import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy, set_health
from tests.support.waiting import until


def at(value: str) -> datetime:
    return datetime.fromisoformat(value)


@pytest.fixture
async def api(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        discovery(nats_server.url, lease_cooldown=0.0, max_lease_ttl=600.0) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        yield client


async def test_lists_proxies_with_their_lease_state(
    api: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "de1", {"country": "de"}, port=3001)
    await ready_proxy(jetstream_store, "us1", {"country": "us"}, port=3002)
    await ready_proxy(jetstream_store, "pend", {"country": "de"}, phase=Phase.PROVISIONING)

    async def three() -> bool:
        return len((await api.get("/v1/proxies")).json()["items"]) == 3

    await until(three)
    items = (await api.get("/v1/proxies")).json()["items"]
    assert [p["uid"] for p in items] == ["de1", "pend", "us1"]  # by namespace, then name
    de1 = items[0]
    assert de1["phase"] == "Ready"
    assert de1["url"] == "http://127.0.0.1:3001"
    assert de1["attributes"] == {"country": "de"}
    assert de1["healthy"] is None
    assert (de1["available"], de1["leased"], de1["fencing_token"]) == (True, False, 0)
    assert items[1]["available"] is False  # not Ready yet

    de = (await api.get("/v1/proxies", params={"selector": "country=de"})).json()["items"]
    assert [p["uid"] for p in de] == ["de1", "pend"]
    free = (await api.get("/v1/proxies", params={"available": "true"})).json()["items"]
    assert [p["uid"] for p in free] == ["de1", "us1"]
    one = await api.get("/v1/proxies/us1")
    assert one.status_code == 200
    assert one.json()["url"] == "http://127.0.0.1:3002"
    missing = await api.get("/v1/proxies/nope")
    assert missing.status_code == 404
    assert missing.json()["error"] == "unknown_proxy"


async def test_acquire_get_release(
    api: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "de1", {"country": "de", "tier": "gold"})
    await until(lambda: _has_proxies(api, 1))

    got = await api.post(
        "/v1/leases",
        json={"selector": {"country": "de"}, "ttl_seconds": 60, "holder": "crawler-1"},
    )
    assert got.status_code == 201, got.text
    lease = got.json()
    assert lease["state"] == "active"
    assert lease["holder"] == "crawler-1"
    assert lease["proxy"]["uid"] == "de1"
    assert lease["proxy"]["url"] == "http://127.0.0.1:3128"
    assert lease["fencing_token"] == 1
    assert at(lease["expires_at"]) - at(lease["acquired_at"]) == timedelta(seconds=60)

    # Read-your-writes on the same replica, right after the answer.
    again = await api.get(f"/v1/leases/{lease['id']}")
    assert again.status_code == 200
    assert again.json()["id"] == lease["id"]
    proxy = (await api.get("/v1/proxies/de1")).json()
    assert (proxy["leased"], proxy["available"]) == (True, False)

    busy = await api.post("/v1/leases", json={"selector": {"country": "de"}})
    assert busy.status_code == 503
    assert busy.json()["error"] == "no_proxy_available"
    assert int(busy.headers["retry-after"]) >= 1

    released = await api.delete(f"/v1/leases/{lease['id']}")
    assert released.status_code == 200, released.text
    assert released.json()["state"] == "released"
    assert released.json()["ended_at"] is not None
    twice = await api.delete(f"/v1/leases/{lease['id']}")
    assert twice.status_code == 200
    assert twice.json()["state"] == "released"

    second = await api.post("/v1/leases", json={"selector": {"tier": "gold"}})
    assert second.status_code == 201, second.text
    assert second.json()["fencing_token"] == 2
    assert second.json()["ttl_seconds"] == 300  # the default, under the maximum

    history = await jetstream_store.read(subjects.lease("de1"))
    released_events = [r.event for r in history.events if isinstance(r.event, LeaseReleased)]
    assert len(released_events) == 1  # the second DELETE appended nothing


async def _has_proxies(api: httpx.AsyncClient, n: int) -> bool:
    return len((await api.get("/v1/proxies")).json()["items"]) >= n


async def test_lease_expires_and_is_recorded(
    api: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    await until(lambda: _has_proxies(api, 1))
    lease = (await api.post("/v1/leases", json={"ttl_seconds": 0.5})).json()

    async def expired() -> bool:
        history = await jetstream_store.read(subjects.lease("p1"))
        return any(isinstance(r.event, LeaseExpired) for r in history.events)

    await until(expired, timeout=10)
    state = (await api.get(f"/v1/leases/{lease['id']}")).json()
    assert state["state"] == "expired"
    assert state["ended_at"] == lease["expires_at"]
    nxt = await api.post("/v1/leases", json={})
    assert nxt.status_code == 201
    assert nxt.json()["fencing_token"] == 2
    view = fold_leases((await jetstream_store.read(subjects.lease("p1"))).events)
    assert view is not None
    assert (view.granted, view.rejected) == (2, 0)


async def test_unhealthy_and_not_ready_proxies_are_not_leased(
    api: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "sick", {"pool": "a"})
    await set_health(jetstream_store, "sick", False)
    await ready_proxy(jetstream_store, "new", {"pool": "a"}, phase=Phase.PROVISIONING)
    await until(lambda: _has_proxies(api, 2))

    async def sick_seen() -> bool:
        return (await api.get("/v1/proxies/sick")).json()["healthy"] is False

    await until(sick_seen)
    none = await api.post("/v1/leases", json={"selector": {"pool": "a"}})
    assert none.status_code == 503
    assert "no Ready, healthy proxy matches" in none.json()["message"]
    await set_health(jetstream_store, "sick", True)

    async def leased() -> bool:
        got = await api.post("/v1/leases", json={"selector": {"pool": "a"}})
        return got.status_code == 201 and got.json()["proxy"]["uid"] == "sick"

    await until(leased)


async def test_reports_are_kept_on_the_lease(
    api: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    await until(lambda: _has_proxies(api, 1))
    lease = (await api.post("/v1/leases", json={})).json()
    ok = await api.post(
        f"/v1/leases/{lease['id']}/report", json={"outcome": "blocked", "detail": "HTTP 403"}
    )
    assert ok.status_code == 200, ok.text
    assert [(o["outcome"], o["detail"]) for o in ok.json()["outcomes"]] == [("blocked", "HTTP 403")]
    await api.delete(f"/v1/leases/{lease['id']}")
    late = await api.post(f"/v1/leases/{lease['id']}/report", json={"outcome": "success"})
    assert late.status_code == 200
    assert [o["outcome"] for o in late.json()["outcomes"]] == ["blocked", "success"]
    bad = await api.post(f"/v1/leases/{lease['id']}/report", json={"outcome": "Not A Word"})
    assert bad.status_code == 400
    assert bad.json()["error"] == "invalid_request"
    unknown = await api.post("/v1/leases/nope/report", json={"outcome": "success"})
    assert unknown.status_code == 404
    assert unknown.json() == {
        "error": "unknown_lease",
        "message": "no lease 'nope' (unknown, or too old to be kept)",
    }


async def test_cooldown_after_release(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    async with (
        discovery(nats_server.url, lease_cooldown=1.0) as (_, base),
        httpx.AsyncClient(base_url=base) as client,
    ):
        await until(lambda: _has_proxies(client, 1))
        lease = (await client.post("/v1/leases", json={})).json()
        released = (await client.delete(f"/v1/leases/{lease['id']}")).json()
        assert at(released["cooldown_until"]) == at(released["ended_at"]) + timedelta(seconds=1)
        resting = await client.post("/v1/leases", json={})
        assert resting.status_code == 503
        assert resting.headers["retry-after"] == "1"
        proxy = (await client.get("/v1/proxies/p1")).json()
        assert (proxy["leased"], proxy["available"]) == (False, False)
        assert proxy["cooldown_until"] == released["cooldown_until"]
        await asyncio.sleep(1.1)
        assert (await client.post("/v1/leases", json={})).status_code == 201


async def test_a_new_replica_catches_up_before_serving(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    async with (
        discovery(nats_server.url) as (_, first),
        httpx.AsyncClient(base_url=first) as client,
    ):
        await until(lambda: _has_proxies(client, 1))
        lease = (await client.post("/v1/leases", json={"holder": "a"})).json()
    async with (
        discovery(nats_server.url) as (service, second),
        httpx.AsyncClient(base_url=second) as client,
    ):
        assert isinstance(service, DiscoveryService)
        seen = await client.get(f"/v1/leases/{lease['id']}")
        assert seen.status_code == 200
        assert seen.json()["holder"] == "a"
        assert (await client.post("/v1/leases", json={})).status_code == 503


async def test_replicas_record_each_expiry_once(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    for uid in ("p1", "p2", "p3"):
        await ready_proxy(jetstream_store, uid)
    async with (
        discovery(nats_server.url, expiry_interval=0.05) as (_, first),
        discovery(nats_server.url, expiry_interval=0.05) as (_, second),
        httpx.AsyncClient(base_url=first) as a,
        httpx.AsyncClient(base_url=second) as b,
    ):
        await until(lambda: _has_proxies(b, 3))
        leases = [
            (await client.post("/v1/leases", json={"ttl_seconds": 0.3})).json()
            for client in (a, b, a)
        ]
        assert len({lease["proxy"]["uid"] for lease in leases}) == 3

        async def all_expired() -> bool:
            for client in (a, b):
                for lease in leases:
                    state = (await client.get(f"/v1/leases/{lease['id']}")).json()["state"]
                    if state != "expired":
                        return False
            return True

        await until(all_expired, timeout=10)
        await asyncio.sleep(0.5)  # ten more sweeps on each replica
    for uid in ("p1", "p2", "p3"):
        history = await jetstream_store.read(subjects.lease(uid))
        expired = [r for r in history.events if isinstance(r.event, LeaseExpired)]
        assert len(expired) == 1, uid
        # Recorded after the end, never before: the fold would ignore an early one anyway.
        lease = next(x for x in leases if x["proxy"]["uid"] == uid)
        assert expired[0].timestamp >= at(lease["expires_at"]) - timedelta(milliseconds=1)
