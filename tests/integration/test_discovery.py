"""The discovery API over real HTTP, against a real nats-server: proxies, leases, errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from events import subjects
from events.schemas import LeaseAcquired, LeaseExpired, LeaseReleased, LeaseReported, Phase
from projections.lease import fold as fold_leases
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, grant_seq, ready_proxy, set_health
from tests.support.waiting import until

pytestmark = pytest.mark.integration

CLOCKS = timedelta(milliseconds=100)
"""How far this process's clock may be behind the service's estimate of the server's."""


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


LEASE_FIELDS = {"id", "proxy", "acquiredAt", "expiresAt", "fencingToken"}
PROXY_FIELDS = {"uid", "url", "ip", "attributes"}


def gone(response: httpx.Response) -> bool:
    """404 with the documented error code (the message is for people and may change)."""
    return response.status_code == 404 and response.json()["error"] == "unknown_lease"


async def test_acquire_get_release(
    api: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "de1", {"country": "de", "tier": "gold"})
    await until(lambda: _has_proxies(api, 1))

    got = await api.post(
        "/v1/leases",
        json={"selector": {"country": "de"}, "ttlSeconds": 60, "holder": "crawler-1"},
    )
    assert got.status_code == 201, got.text
    lease = got.json()
    assert set(lease) >= LEASE_FIELDS
    assert set(lease["proxy"]) >= PROXY_FIELDS
    assert lease["proxy"]["uid"] == "de1"
    assert lease["proxy"]["url"] == "http://127.0.0.1:3128"
    assert lease["proxy"]["ip"] == "127.0.0.1"
    assert lease["proxy"]["attributes"] == {"country": "de", "tier": "gold"}
    # The token is the grant's stream sequence (the first event of LEASE here).
    assert lease["fencingToken"] == await grant_seq(jetstream_store, "de1", lease["id"]) == 1
    assert (lease["ttlSeconds"], lease["ttlClamped"], lease["holder"]) == (60, False, "crawler-1")
    assert at(lease["expiresAt"]) - at(lease["acquiredAt"]) == timedelta(seconds=60)

    # Read-your-writes on the same replica, right after the answer.
    again = await api.get(f"/v1/leases/{lease['id']}")
    assert again.status_code == 200
    assert again.json() == lease
    proxy = (await api.get("/v1/proxies/de1")).json()
    assert (proxy["leased"], proxy["available"]) == (True, False)

    busy = await api.post("/v1/leases", json={"selector": {"country": "de"}})
    assert busy.status_code == 503
    assert busy.json()["error"] == "no_proxy_available"
    assert int(busy.headers["retry-after"]) >= 1

    released = await api.delete(f"/v1/leases/{lease['id']}")
    assert released.status_code == 204, released.text
    assert released.content == b""
    # A DELETE is idempotent: a retry whose first answer was lost hears 204 again.
    assert (await api.delete(f"/v1/leases/{lease['id']}")).status_code == 204
    # Released is no longer active: the other lease routes answer it like an unknown lease.
    assert gone(await api.get(f"/v1/leases/{lease['id']}"))
    assert gone(await api.post(f"/v1/leases/{lease['id']}/report", json={"outcome": "success"}))

    second = await api.post("/v1/leases", json={"selector": {"tier": "gold"}})
    assert second.status_code == 201, second.text
    # Higher than the first, and not the next integer: the release sits in between.
    token = second.json()["fencingToken"]
    assert token == await grant_seq(jetstream_store, "de1", second.json()["id"]) == 3
    assert token > lease["fencingToken"]
    assert second.json()["ttlSeconds"] == 300  # the default, under the maximum

    history = await jetstream_store.read(subjects.lease("de1"))
    released_events = [r.event for r in history.events if isinstance(r.event, LeaseReleased)]
    assert len(released_events) == 1  # the second DELETE appended nothing


async def test_a_ttl_above_the_maximum_is_clamped(
    api: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    await until(lambda: _has_proxies(api, 1))
    got = await api.post("/v1/leases", json={"ttlSeconds": 7200})  # the maximum is 600
    assert got.status_code == 201, got.text
    lease = got.json()
    assert (lease["ttlSeconds"], lease["ttlClamped"]) == (600, True)
    assert at(lease["expiresAt"]) - at(lease["acquiredAt"]) == timedelta(seconds=600)
    assert (await api.get(f"/v1/leases/{lease['id']}")).json()["ttlClamped"] is True
    history = await jetstream_store.read(subjects.lease("p1"))
    (claim,) = [r.event for r in history.events if isinstance(r.event, LeaseAcquired)]
    assert (claim.ttl_seconds, claim.requested_ttl_seconds) == (600, 7200)


async def _has_proxies(api: httpx.AsyncClient, n: int) -> bool:
    return len((await api.get("/v1/proxies")).json()["items"]) >= n


async def test_an_expired_lease_is_gone_and_its_expiry_recorded(
    api: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    await until(lambda: _has_proxies(api, 1))
    lease = (await api.post("/v1/leases", json={"ttlSeconds": 1})).json()
    lease_id = lease["id"]
    assert (await api.get(f"/v1/leases/{lease_id}")).status_code == 200

    async def expired() -> bool:
        history = await jetstream_store.read(subjects.lease("p1"))
        return any(isinstance(r.event, LeaseExpired) for r in history.events)

    await until(expired, timeout=10)
    assert gone(await api.get(f"/v1/leases/{lease_id}"))
    assert gone(await api.post(f"/v1/leases/{lease_id}/report", json={"outcome": "failed"}))
    assert gone(await api.delete(f"/v1/leases/{lease_id}"))
    history = await jetstream_store.read(subjects.lease("p1"))
    kinds = [type(r.event).__name__ for r in history.events]
    assert kinds == ["LeaseAcquired", "LeaseExpired"]  # the 404s appended nothing
    nxt = await api.post("/v1/leases", json={})
    assert nxt.status_code == 201
    assert nxt.json()["fencingToken"] == await grant_seq(jetstream_store, "p1", nxt.json()["id"])
    assert nxt.json()["fencingToken"] > lease["fencingToken"]
    view = fold_leases((await jetstream_store.read(subjects.lease("p1"))).events)
    assert view is not None
    assert (view.granted, view.rejected) == (2, 0)


async def test_past_its_end_a_lease_is_gone_before_the_expiry_is_recorded(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    # No sweep within the test: only the lease's own end makes it unknown.
    async with (
        discovery(nats_server.url, expiry_interval=3600) as (_, base),
        httpx.AsyncClient(base_url=base) as api,
    ):
        lease = (await api.post("/v1/leases", json={"ttlSeconds": 1})).json()  # the shortest
        assert (await api.get(f"/v1/leases/{lease['id']}")).status_code == 200

        async def ended() -> bool:
            return gone(await api.get(f"/v1/leases/{lease['id']}"))

        await until(ended, timeout=10, what="the lease gone at its end")
        assert datetime.now(UTC) >= at(lease["expiresAt"]) - CLOCKS, "gone before its end"
        assert gone(await api.delete(f"/v1/leases/{lease['id']}"))
    history = await jetstream_store.read(subjects.lease("p1"))
    assert [type(r.event).__name__ for r in history.events] == ["LeaseAcquired"]


async def test_only_ready_and_healthy_proxies_are_leased(
    api: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "sick", {"pool": "a"})
    await set_health(jetstream_store, "sick", False)
    await ready_proxy(jetstream_store, "new", {"pool": "a"}, phase=Phase.PROVISIONING)
    await ready_proxy(jetstream_store, "unprobed", {"pool": "a"}, healthy=None)
    await until(lambda: _has_proxies(api, 3))

    async def sick_seen() -> bool:
        return (await api.get("/v1/proxies/sick")).json()["healthy"] is False

    await until(sick_seen)
    none = await api.post("/v1/leases", json={"selector": {"pool": "a"}})
    assert none.status_code == 503  # they exist, and may serve soon: the request is right
    assert none.json()["error"] == "no_proxy_available"
    message = none.json()["message"]
    assert "3 proxies match the selector {'pool': 'a'}" in message
    for reason in ("1 not Ready (Provisioning)", "1 unhealthy (last probe: ", "1 not probed yet"):
        assert reason in message, message
    assert none.headers["retry-after"] == "5"
    await set_health(jetstream_store, "unprobed", True)  # the first verdict

    async def leased() -> bool:
        got = await api.post("/v1/leases", json={"selector": {"pool": "a"}})
        return got.status_code == 201 and got.json()["proxy"]["uid"] == "unprobed"

    await until(leased)


async def test_the_selector_must_match_every_pair(
    api: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "de-gold", {"country": "de", "tier": "gold"})
    await ready_proxy(jetstream_store, "de-basic", {"country": "de", "tier": "basic"})
    await ready_proxy(jetstream_store, "us-gold", {"country": "us", "tier": "gold"})
    await until(lambda: _has_proxies(api, 3))

    async def lease(selector: dict[str, str]) -> str:
        got = await api.post("/v1/leases", json={"selector": selector, "ttlSeconds": 30})
        assert got.status_code == 201, (selector, got.text)
        return str(got.json()["proxy"]["uid"])

    assert await lease({"country": "de", "tier": "gold"}) == "de-gold"
    assert await lease({"tier": "gold"}) == "us-gold"  # de-gold is taken
    assert await lease({"country": "de"}) == "de-basic"
    for selector in ({"country": "de"}, {}):
        busy = await api.post("/v1/leases", json={"selector": selector})
        assert busy.status_code == 503, selector
        assert busy.json()["error"] == "no_proxy_available"
        assert "leased" in busy.json()["message"]
    for selector in ({"country": "fr"}, {"country": "de", "x": "y"}, {"contry": "de"}):
        none = await api.post("/v1/leases", json={"selector": selector})
        assert none.status_code == 422, selector
        assert none.json()["error"] == "no_matching_proxy"
        assert "retry-after" not in none.headers
    assert "did you mean 'country'?" in none.json()["message"]


async def test_reports_are_recorded_while_the_lease_is_active(
    api: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    await until(lambda: _has_proxies(api, 1))
    lease = (await api.post("/v1/leases", json={})).json()
    path = f"/v1/leases/{lease['id']}/report"
    blocked = {"outcome": "blocked", "target": "shop.example", "detail": "HTTP 403"}
    ok = await api.post(path, json=blocked)
    assert ok.status_code == 204, ok.text
    assert ok.content == b""
    assert (await api.post(path, json={"outcome": "success"})).status_code == 204
    shown = (await api.get(f"/v1/leases/{lease['id']}")).json()["outcomes"]
    assert [(o["outcome"], o["target"], o["detail"]) for o in shown] == [
        ("blocked", "shop.example", "HTTP 403"),
        ("success", "", ""),
    ]
    history = await jetstream_store.read(subjects.lease("p1"))
    reports = [r.event for r in history.events if isinstance(r.event, LeaseReported)]
    assert [(e.lease_id, e.outcome, e.target, e.detail) for e in reports] == [
        (lease["id"], "blocked", "shop.example", "HTTP 403"),
        (lease["id"], "success", "", ""),
    ]

    for body, field in (
        ({"outcome": "captcha"}, "outcome"),
        ({"outcome": "Success"}, "outcome"),
        ({}, "outcome"),
        ({"outcome": "failed", "target": 7}, "target"),
        ({"outcome": "failed", "colour": "red"}, "colour"),
    ):
        bad = await api.post(path, json=body)
        assert bad.status_code == 400, body
        assert bad.json()["error"] == "invalid_request"
        assert field in bad.json()["message"], bad.json()
    assert gone(await api.post("/v1/leases/nope/report", json={"outcome": "success"}))
    assert (await api.get("/metrics")).text.count('egress_lease_reports_total{outcome="') == 2


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
        assert (await client.delete(f"/v1/leases/{lease['id']}")).status_code == 204
        resting = await client.post("/v1/leases", json={})
        assert resting.status_code == 503
        assert resting.headers["retry-after"] == "1"
        proxy = (await client.get("/v1/proxies/p1")).json()
        assert (proxy["leased"], proxy["available"]) == (False, False)
        history = await jetstream_store.read(subjects.lease("p1"))
        released = history.events[-1]
        assert isinstance(released.event, LeaseReleased)
        rest = at(proxy["cooldownUntil"]) - released.timestamp
        assert abs(rest - timedelta(seconds=1)) < timedelta(milliseconds=1)  # µs rounding apart

        async def rested() -> bool:
            return (await client.get("/v1/proxies/p1")).json()["available"] is True

        await until(rested, timeout=10, what="p1 available once its cooldown is over")
        assert datetime.now(UTC) >= at(proxy["cooldownUntil"]) - CLOCKS, "available too early"
        assert (await client.post("/v1/leases", json={})).status_code == 201
