"""Pools in the discovery API over real HTTP and a real nats-server: a pool's figures as its
events and its members' events leave them, leases kept to a pool's members in its namespace, a
503 that says whether the pool is scaling, and every bad ``pool`` refused naming the field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from egress_proxies_client import AsyncClient, NoProxyAvailable, UnknownPool
from events import subjects
from events.poolresource import pool_uid
from events.schemas import Condition, HealthChanged, Phase, PhaseChanged
from events.store import EventStore, NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.pure.clients import hash_token
from tests.support.discovery import bearer_client, discovery, ready_proxy
from tests.support.discovery_pools import declare_pool, member, member_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

DE = pool_uid("crawl", "de")
US = pool_uid("crawl", "us")
SOLO = pool_uid("default", "solo")


DE_MEMBERS = (
    member("de", "crawl", DE, 0, "local"),
    member("de", "crawl", DE, 1, "local"),
    member("de", "crawl", DE, 2, "gcp-eu"),
)
US_MEMBERS = (member("us", "crawl", US, 0, "local"), member("us", "crawl", US, 1, "local"))
SOLO_MEMBER = member("solo", "default", SOLO, 0, "local")
STRANGER = "stranger"
"""A proxy with the members' very attributes, in another namespace: no member of crawl/de."""


async def turn_ready(store: EventStore, uid: str) -> None:
    ready = PhaseChanged(
        phase=Phase.READY,
        reason="InstanceRunning",
        ip="127.0.0.1",
        url="http://127.0.0.1:3128",
        conditions=(Condition(type="Ready", status="True", reason="Running"),),
    )
    verdict = HealthChanged(healthy=True, reason="Probe", latency_ms=5.0)
    await store.append(
        subjects.proxy(uid), [NewEvent(ready, f"late-ready-{uid}"), NewEvent(verdict, f"v-{uid}")]
    )


@pytest.fixture
async def fleet(jetstream_store: JetStreamEventStore) -> JetStreamEventStore:
    """crawl/de: 3 members, 2 Ready and healthy, the third provisioning; crawl/us: 2 members
    planned, no Proxy declared yet; default/solo: 1 Ready member; and a stranger."""
    store = jetstream_store
    await declare_pool(store, DE, "crawl", "de", DE_MEMBERS)
    await declare_pool(store, US, "crawl", "us", US_MEMBERS)
    await declare_pool(store, SOLO, "default", "solo", (SOLO_MEMBER,))
    await member_proxy(store, "de", DE_MEMBERS[0])
    await member_proxy(store, "de", DE_MEMBERS[2])
    await member_proxy(store, "de", DE_MEMBERS[1], phase=Phase.PROVISIONING, healthy=None)
    await member_proxy(store, "solo", SOLO_MEMBER, namespace="default")
    await ready_proxy(store, STRANGER, {"country": "de", "pool": "de"}, namespace="other")
    return store


@pytest.fixture
async def api(
    nats_server: EmbeddedNatsServer, fleet: JetStreamEventStore
) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        discovery(nats_server.url) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        yield client


def by_name(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{p['namespace']}/{p['name']}": p for p in body["items"]}


async def lease(api: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await api.post("/v1/leases", json={"holder": "t", **body})


async def test_get_pools_answers_each_pools_figures(api: httpx.AsyncClient) -> None:
    listed = await api.get("/v1/pools")
    assert listed.status_code == 200, listed.text
    pools = by_name(listed.json())
    assert list(pools) == ["crawl/de", "crawl/us", "default/solo"]
    de = pools["crawl/de"]
    assert (de["uid"], de["desired"], de["members"]) == (DE, 3, 3)
    assert (de["ready"], de["healthy"], de["leased"], de["available"]) == (2, 2, 0, 2)
    assert de["providers"] == {
        "gcp-eu": {"members": 1, "ready": 1},
        "local": {"members": 2, "ready": 1},
    }
    conditions = {c["type"]: c for c in de["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Scaling"]["status"]) == ("False", "True")
    assert conditions["Scaling"]["reason"] == "MembersNotReady"
    assert conditions["Scaling"]["message"] == "3 of 3 members, 2 Ready"
    assert de["deleting"] is False
    decision = de["lastDecision"]
    assert (decision["reason"], decision["message"]) == ("ScaleUp", "added 3 (0 -> 3 of 3)")
    assert decision["figures"]["desired"] == 3
    assert decision["at"] is not None
    us = pools["crawl/us"]
    assert (us["members"], us["ready"], us["available"]) == (2, 0, 0)
    assert {c["type"]: c["reason"] for c in us["conditions"]}["Scaling"] == "MembersNotReady"
    solo = pools["default/solo"]
    assert [c["status"] for c in solo["conditions"]] == ["True", "False"]  # Ready, not scaling

    one = await api.get("/v1/pools/crawl/de")
    assert one.status_code == 200
    assert one.json() == de

    # A lease shows in the figures at once: leased, no longer available.
    assert (await lease(api, pool="crawl/de")).status_code == 201
    de = (await api.get("/v1/pools/crawl/de")).json()
    assert (de["leased"], de["available"]) == (1, 1)


async def test_pools_are_filtered_by_namespace_and_unknown_ones_are_404(
    api: httpx.AsyncClient,
) -> None:
    crawl = (await api.get("/v1/pools", params={"namespace": "crawl"})).json()
    assert list(by_name(crawl)) == ["crawl/de", "crawl/us"]
    assert (await api.get("/v1/pools", params={"namespace": "other"})).json() == {"items": []}
    for params in ({"namespce": "crawl"}, {"namespace": "../x"}, {"namespace": ""}):
        bad = await api.get("/v1/pools", params=params)
        assert (bad.status_code, bad.json()["error"]) == (400, "invalid_request"), params
    missing = await api.get("/v1/pools/other/de")
    assert (missing.status_code, missing.json()["error"]) == (404, "unknown_pool")
    assert "crawl/de" in missing.json()["message"]  # the pool of that name elsewhere
    gone = await api.get("/v1/pools/crawl/nope")
    assert (gone.status_code, gone.json()["error"]) == (404, "unknown_pool")


async def test_a_pool_lease_gets_only_members_of_the_pools_namespace(
    api: httpx.AsyncClient, fleet: JetStreamEventStore
) -> None:
    got = [await lease(api, pool="crawl/de") for _ in range(2)]
    assert [r.status_code for r in got] == [201, 201], [r.text for r in got]
    held = {r.json()["proxy"]["uid"] for r in got}
    assert held == {DE_MEMBERS[0].uid, DE_MEMBERS[2].uid}
    assert got[0].json()["selector"] == {"pool": "de"}  # the lease records the pool it chose

    # The stranger has the members' attributes but is in another namespace: never a member.
    busy = await lease(api, pool="crawl/de")
    assert (busy.status_code, busy.json()["error"]) == (503, "no_proxy_available")
    message = busy.json()["message"]
    assert "the pool crawl/de is scaling (3 of 3 members, 2 Ready)" in message
    assert "1 not Ready (Provisioning)" in message
    assert "2 leased" in message
    assert busy.headers["retry-after"]
    stranger = (await api.get(f"/v1/proxies/{STRANGER}")).json()
    assert stranger["available"] is True
    # The same attributes without the pool's namespace do get it.
    plain = await lease(api, selector={"pool": "de"})
    assert plain.json()["proxy"]["uid"] == STRANGER

    # The last member turns Ready: the pool is at its size, and a 503 says it is not scaling.
    await turn_ready(fleet, DE_MEMBERS[1].uid)

    async def third() -> bool:
        available: int = (await api.get("/v1/pools/crawl/de")).json()["available"]
        return available == 1

    await until(third, what="the third member available")
    assert (await lease(api, pool="crawl/de")).json()["proxy"]["uid"] == DE_MEMBERS[1].uid
    full = await lease(api, pool="crawl/de")
    assert full.status_code == 503
    assert "the pool crawl/de is not scaling (3 of 3 members, 3 Ready)" in full.json()["message"]

    text = (await api.get("/metrics")).text
    assert 'egress_lease_pool_busy_total{scaling="true"} 1.0' in text
    assert 'egress_lease_pool_busy_total{scaling="false"} 1.0' in text


async def test_a_pool_whose_members_are_not_declared_yet_is_scaling_not_unmatched(
    api: httpx.AsyncClient,
) -> None:
    early = await lease(api, pool="crawl/us")
    assert (early.status_code, early.json()["error"]) == (503, "no_proxy_available")
    assert "the pool crawl/us is scaling (2 of 2 members, 0 Ready)" in early.json()["message"]
    assert early.headers["retry-after"] == "5"
    # A selector its members can never have is a 422, however the pool scales.
    never = await lease(api, pool="crawl/us", selector={"country": "fr"})
    assert (never.status_code, never.json()["error"]) == (422, "no_matching_proxy")
    assert "country" in never.json()["message"]


async def test_a_bare_pool_name_is_in_the_namespace_default(api: httpx.AsyncClient) -> None:
    solo = await lease(api, pool="solo")
    assert solo.status_code == 201, solo.text
    assert solo.json()["proxy"]["uid"] == SOLO_MEMBER.uid
    bare = await lease(api, pool="de")  # default/de: there is none
    assert (bare.status_code, bare.json()["error"]) == (404, "unknown_pool")
    assert "crawl/de" in bare.json()["message"]


@pytest.mark.parametrize(
    "pool",
    ["a/b/c", "", "x" * 300, "../x", 5, "Crawl/de", "crawl/", "/de", "crawl/de\n", ["crawl/de"]],
)
async def test_a_bad_pool_is_a_400_naming_it(api: httpx.AsyncClient, pool: object) -> None:
    bad = await lease(api, pool=pool)
    assert (bad.status_code, bad.json()["error"]) == (400, "invalid_request"), bad.text
    assert bad.json()["message"].startswith("pool"), bad.json()["message"]


async def test_a_selector_naming_another_pool_is_a_400(api: httpx.AsyncClient) -> None:
    bad = await lease(api, pool="crawl/de", selector={"pool": "us"})
    assert (bad.status_code, bad.json()["error"]) == (400, "invalid_request")
    assert bad.json()["message"].startswith("pool:")
    same = await lease(api, pool="crawl/de", selector={"pool": "de"})
    assert same.status_code == 201


async def test_the_client_library_leases_from_a_pool(api: httpx.AsyncClient) -> None:
    async with AsyncClient(str(api.base_url), holder="lib") as client:
        async with client.lease(pool="default/solo", ttl=30) as held:
            assert held.proxy.uid == SOLO_MEMBER.uid
            with pytest.raises(NoProxyAvailable, match="not scaling"):
                await client.acquire(pool="default/solo")
        with pytest.raises(UnknownPool):
            await client.acquire(pool="crawl/nope")


TOKENS = {"crawler": "c" * 40, "viewer": "v" * 40, "german": "g" * 40}


async def test_pools_need_the_read_scope_and_a_pool_lease_an_allowed_selector(
    nats_server: EmbeddedNatsServer, fleet: JetStreamEventStore, tmp_path: Path
) -> None:
    file = tmp_path / "clients.yaml"
    file.write_text(
        "clients:\n"
        f"  - {{name: crawler, token: '{hash_token(TOKENS['crawler'])}', scopes: [lease]}}\n"
        f"  - {{name: viewer, token: '{hash_token(TOKENS['viewer'])}', scopes: [read]}}\n"
        f"  - {{name: german, token: '{hash_token(TOKENS['german'])}', scopes: [lease],"
        " selectors: [{pool: solo}]}\n"
    )
    async with discovery(nats_server.url, clients_file=file) as (_, base):

        def as_(name: str) -> httpx.AsyncClient:
            return bearer_client(base, TOKENS[name])

        async with (
            httpx.AsyncClient(base_url=base) as nobody,
            as_("crawler") as crawler,
            as_("viewer") as viewer,
            as_("german") as german,
        ):
            assert (await nobody.get("/v1/pools")).status_code == 401
            for path in ("/v1/pools", "/v1/pools/crawl/de"):
                assert (await crawler.get(path)).status_code == 403, path
                assert (await viewer.get(path)).status_code == 200, path
            # The pool counts as its attribute against a client's allowed selectors.
            refused = await lease(german, pool="crawl/de")
            assert (refused.status_code, refused.json()["error"]) == (403, "forbidden")
            assert (await lease(german, pool="default/solo")).status_code == 201
