"""A holder's own leases, ``exclude`` and sticky ``proxyUid``, on two discovery replicas and a
real nats-server: what one replica wrote, the other lists, releases or refuses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

import httpx
import pytest

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

Pair = tuple[httpx.AsyncClient, httpx.AsyncClient]
UIDS = ("p1", "p2", "p3")


@pytest.fixture
async def pair(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> AsyncIterator[Pair]:
    for uid in UIDS:
        await ready_proxy(jetstream_store, uid, {"country": "de"})
    async with (
        discovery(nats_server.url) as (_, first),
        discovery(nats_server.url) as (_, second),
        httpx.AsyncClient(base_url=first, timeout=10) as a,
        httpx.AsyncClient(base_url=second, timeout=10) as b,
    ):
        for client in (a, b):

            async def seen(c: httpx.AsyncClient = client) -> bool:
                return len((await c.get("/v1/proxies")).json()["items"]) == len(UIDS)

            await until(seen, what="the proxies on each replica")
        yield a, b


async def _ids(client: httpx.AsyncClient, holder: str) -> list[str]:
    got = await client.get("/v1/leases", params={"holder": holder})
    assert got.status_code == 200, got.json()
    return [lease["id"] for lease in got.json()["items"]]


async def test_a_holder_lists_and_releases_its_own_leases_on_any_replica(pair: Pair) -> None:
    a, b = pair
    mine = [(await c.post("/v1/leases", json={"holder": "c1"})).json() for c in (a, b)]
    other = (await a.post("/v1/leases", json={"holder": "c2"})).json()
    want = [lease["id"] for lease in mine]

    async def listed(client: httpx.AsyncClient) -> bool:
        return sorted(await _ids(client, "c1")) == sorted(want)

    for client in (a, b):
        await until(partial(listed, client), what="both leases of c1")
    assert await _ids(a, "c1") == want  # oldest first
    assert await _ids(a, "nobody") == []
    freed = await b.delete("/v1/leases", params={"holder": "c1"})
    assert (freed.status_code, freed.json()) == (200, {"released": 2})

    async def gone(client: httpx.AsyncClient, lease_id: str) -> bool:
        answer = await client.get(f"/v1/leases/{lease_id}")
        return bool(answer.json().get("error") == "unknown_lease")

    # The other replica learns the release from the log: on a busy machine, a moment later.
    for lease in mine:
        for client in (a, b):
            await until(partial(gone, client, lease["id"]), what="the release on every replica")
    assert await _ids(a, "c1") == []
    assert (await a.get(f"/v1/leases/{other['id']}")).status_code == 200
    again = await a.delete("/v1/leases", params={"holder": "c1"})
    assert again.json() == {"released": 0}
    for method in ("GET", "DELETE"):
        for params in ({}, {"holder": ""}, {"holder": "x" * 257}):
            refused = await a.request(method, "/v1/leases", params=params)
            assert refused.status_code == 400, (method, params)
            assert refused.json()["message"].startswith("holder:"), refused.json()


async def test_exclude_keeps_the_lease_off_those_proxies(pair: Pair) -> None:
    a, b = pair
    lease = (await a.post("/v1/leases", json={"exclude": ["p1", "p2"]})).json()
    assert lease["proxy"]["uid"] == "p3"
    assert (await a.delete(f"/v1/leases/{lease['id']}")).status_code == 204
    every = await b.post("/v1/leases", json={"exclude": list(UIDS)})
    assert every.status_code == 422
    assert every.json()["error"] == "no_matching_proxy"
    assert "exclude" in every.json()["message"]
    assert "retry-after" not in every.headers
    held = (await a.post("/v1/leases", json={"exclude": ["p1", "p2"]})).json()
    busy = await b.post("/v1/leases", json={"exclude": ["p1", "p2"]})
    assert busy.status_code == 503
    assert busy.json()["error"] == "no_proxy_available"
    assert int(busy.headers["retry-after"]) >= 1
    assert (await a.delete(f"/v1/leases/{held['id']}")).status_code == 204
    for bad in ({"exclude": "p1"}, {"exclude": [""]}, {"exclude": [1]}):
        refused = await a.post("/v1/leases", json=bad)
        assert refused.status_code == 400, bad
        assert refused.json()["message"].startswith("exclude"), refused.json()


async def test_a_sticky_request_gets_that_proxy_or_waits_for_it(pair: Pair) -> None:
    a, b = pair
    lease = (await a.post("/v1/leases", json={"proxyUid": "p2", "holder": "s"})).json()
    assert lease["proxy"]["uid"] == "p2"
    taken = await b.post("/v1/leases", json={"proxyUid": "p2"})
    assert taken.status_code == 503
    assert taken.json()["error"] == "no_proxy_available"
    assert "'p2'" in taken.json()["message"]
    assert int(taken.headers["retry-after"]) >= 1
    unknown = await b.post("/v1/leases", json={"proxyUid": "nope"})
    assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown_proxy")
    both = await b.post("/v1/leases", json={"proxyUid": "p3", "exclude": ["p3"]})
    assert both.status_code == 400
    assert both.json()["message"].startswith("proxyUid")
    wrong = await b.post("/v1/leases", json={"proxyUid": "p3", "selector": {"country": "fr"}})
    assert (wrong.status_code, wrong.json()["error"]) == (422, "no_matching_proxy")
    assert (await a.delete(f"/v1/leases/{lease['id']}")).status_code == 204
    again = await b.post("/v1/leases", json={"proxyUid": "p2"})
    assert again.status_code == 201
    assert again.json()["proxy"]["uid"] == "p2"
    assert again.json()["fencingToken"] > lease["fencingToken"]
    assert (await b.post("/v1/leases", json={"proxyUid": 7})).status_code == 400
