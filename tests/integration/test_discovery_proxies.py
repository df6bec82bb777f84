"""``GET /v1/proxies`` over real HTTP: the proxy view's fields and the filters."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from events.schemas import Phase
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy, set_health
from tests.support.waiting import until

pytestmark = pytest.mark.integration

VIEW_FIELDS = {
    "uid",
    "namespace",
    "name",
    "url",
    "ip",
    "phase",
    "healthy",
    "latencyMs",
    "attributes",
    "provider",
    "conditions",
}


@pytest.fixture
async def api(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> AsyncIterator[httpx.AsyncClient]:
    await ready_proxy(jetstream_store, "de1", {"country": "de", "tier": "gold"}, port=3001)
    await ready_proxy(jetstream_store, "de2", {"country": "de", "tier": "basic"}, port=3002)
    await ready_proxy(
        jetstream_store, "us1", {"country": "us", "tier": "gold"}, port=3003, healthy=None
    )
    pending = Phase.PROVISIONING
    await ready_proxy(jetstream_store, "pend", {"country": "de"}, phase=pending, healthy=None)
    await set_health(jetstream_store, "de1", True, latency_ms=42.5)
    await set_health(jetstream_store, "de2", False)
    async with (
        discovery(nats_server.url) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        yield client


async def uids(api: httpx.AsyncClient, **params: str) -> list[str]:
    response = await api.get("/v1/proxies", params=params)
    assert response.status_code == 200, response.text
    return [p["uid"] for p in response.json()["items"]]


async def test_the_view_has_every_field(api: httpx.AsyncClient) -> None:
    body = (await api.get("/v1/proxies")).json()
    assert set(body) == {"items", "continue", "total"}
    items = {p["uid"]: p for p in body["items"]}
    assert list(items) == ["de1", "de2", "pend", "us1"]  # by namespace, then name
    for item in items.values():
        assert set(item) >= VIEW_FIELDS, item
    de1 = items["de1"]
    assert (de1["namespace"], de1["name"], de1["provider"]) == ("crawl", "px-de1", "local")
    assert (de1["url"], de1["ip"], de1["phase"]) == ("http://127.0.0.1:3001", "127.0.0.1", "Ready")
    assert (de1["healthy"], de1["latencyMs"]) == (True, 42.5)
    assert de1["attributes"] == {"country": "de", "tier": "gold"}
    assert de1["conditions"] == [
        {"type": "Ready", "status": "True", "reason": "Running", "message": ""}
    ]
    assert (de1["leased"], de1["available"], de1["cooldownUntil"]) == (False, True, None)
    assert items["us1"]["available"] is False  # not probed yet: not leased either
    assert (items["de2"]["healthy"], items["de2"]["latencyMs"]) == (False, None)
    assert (items["us1"]["healthy"], items["us1"]["latencyMs"]) == (None, None)  # not probed
    assert items["pend"]["phase"] == "Provisioning"
    assert items["pend"]["available"] is False
    one = (await api.get("/v1/proxies/us1")).json()
    assert one.pop("backoffs") == []  # only the one proxy's answer lists them
    assert one == items["us1"]
    assert de1["reports"] == {"success": 0, "blocked": 0, "failed": 0, "failedStreak": 0}
    assert de1["backoffCount"] == 0
    missing = await api.get("/v1/proxies/nope")
    assert (missing.status_code, missing.json()["error"]) == (404, "unknown_proxy")


async def test_filters(api: httpx.AsyncClient) -> None:
    assert await uids(api, phase="Ready") == ["de1", "de2", "us1"]
    assert await uids(api, phase="provisioning") == ["pend"]  # the phase's case is not asked
    assert await uids(api, healthy="true") == ["de1"]
    assert await uids(api, healthy="false") == ["de2"]  # not probed yet matches neither
    assert await uids(api, **{"attr.country": "de"}) == ["de1", "de2", "pend"]
    assert await uids(api, **{"attr.country": "de", "attr.tier": "gold"}) == ["de1"]
    assert await uids(api, **{"attr.tier": "gold", "phase": "Ready"}) == ["de1", "us1"]
    assert await uids(api, **{"attr.pool": "x"}) == []
    # Repeated: every value must match, and a proxy has one value per key.
    both = await api.get("/v1/proxies?attr.country=de&attr.country=us")
    assert both.json()["items"] == []
    same = await api.get("/v1/proxies?attr.country=de&attr.country=de&healthy=true")
    assert [p["uid"] for p in same.json()["items"]] == ["de1"]


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("phase=Sleeping", "phase"),
        ("healthy=maybe", "healthy"),
        ("selector=country=de", "selector"),
        ("attr.=de", "attr."),
        ("helthy=true", "helthy"),
    ],
)
async def test_a_bad_filter_is_refused_by_name(
    api: httpx.AsyncClient, query: str, named: str
) -> None:
    response = await api.get(f"/v1/proxies?{query}")
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid_request"
    assert named in body["message"]


async def test_lease_state_shows_on_the_proxy(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    async with (
        discovery(nats_server.url, lease_cooldown=30.0) as (_, base),
        httpx.AsyncClient(base_url=base) as api,
    ):
        lease = (await api.post("/v1/leases", json={})).json()
        proxy = (await api.get("/v1/proxies/p1")).json()
        assert (proxy["leased"], proxy["available"], proxy["cooldownUntil"]) == (True, False, None)
        assert "leaseId" not in proxy  # the id is the holder's to release; listings never show it
        assert (await api.delete(f"/v1/leases/{lease['id']}")).status_code == 204

        async def resting() -> bool:
            shown = (await api.get("/v1/proxies/p1")).json()
            return shown["cooldownUntil"] is not None and not shown["leased"]

        await until(resting)
        assert (await api.get("/v1/proxies/p1")).json()["available"] is False
