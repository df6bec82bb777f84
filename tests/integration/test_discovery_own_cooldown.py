"""A client takes back the proxy it released at once; every other client waits for the cooldown
(docs/decisions/0153-a-client-takes-back-its-own-proxy.md). Two discovery replicas with the
default cooldown, a clients file and a real nats-server; the open mode on one replica."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from events import subjects
from events.schemas import LeaseAcquired
from projections.lease import fold
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.integration.test_discovery_clients import TOKENS, clients_yaml
from tests.support.discovery import bearer_client, discovery, grant_seq, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

COOLDOWN = 10.0
"""``--lease-cooldown``'s default."""


@dataclass
class Fleet:
    urls: tuple[str, str]

    def as_(self, name: str, replica: int = 0) -> httpx.AsyncClient:
        return bearer_client(self.urls[replica], TOKENS[name])


@pytest.fixture
async def fleet(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> AsyncIterator[Fleet]:
    await ready_proxy(jetstream_store, "p1", {"country": "de"})
    file = tmp_path / "clients.yaml"
    file.write_text(clients_yaml(("crawler-a", "crawler-b")))
    async with (
        discovery(nats_server.url, clients_file=file, lease_cooldown=COOLDOWN) as (_, first),
        discovery(nats_server.url, clients_file=file, lease_cooldown=COOLDOWN) as (_, second),
    ):
        yield Fleet((first, second))


def sticky(holder: str, **more: object) -> dict[str, object]:
    return {"selector": {"country": "de"}, "holder": holder, "proxyUid": "p1", **more}


def refused_for_the_cooldown(answer: httpx.Response) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"] == "no_proxy_available"
    assert "1 cooling down" in answer.json()["message"]
    # The rest's end, not the 5 s of a proxy without a known end (pure.refusals.UNKNOWN_WAIT).
    assert COOLDOWN - 4 <= int(answer.headers["Retry-After"]) <= COOLDOWN


async def test_a_client_takes_back_what_it_released_and_another_waits(
    fleet: Fleet, jetstream_store: JetStreamEventStore
) -> None:
    async with (
        fleet.as_("crawler-a", 0) as a0,
        fleet.as_("crawler-a", 1) as a1,
        fleet.as_("crawler-b", 0) as b0,
        fleet.as_("crawler-b", 1) as b1,
    ):
        first = await a0.post("/v1/leases", json=sticky("crawl-1"))
        assert first.status_code == 201, first.text
        released = await a0.delete(f"/v1/leases/{first.json()['id']}")
        assert released.status_code == 204, released.text

        # Another client, on either replica, waits for the cooldown: even naming A's holder.
        anywhere = {"selector": {"country": "de"}}
        for b in (b0, b1):
            refused_for_the_cooldown(await b.post("/v1/leases", json=sticky("crawl-1")))
            refused_for_the_cooldown(await b.post("/v1/leases", json=sticky("other")))
            refused_for_the_cooldown(await b.post("/v1/leases", json=anywhere))

        # A takes it back at once, on the other replica, under another holder of its own.
        again = await a1.post("/v1/leases", json=sticky("crawl-2"))
        assert again.status_code == 201, again.text
        lease = again.json()
        assert lease["proxy"]["uid"] == "p1"
        assert lease["fencingToken"] == await grant_seq(jetstream_store, "p1", lease["id"])
        assert lease["fencingToken"] > first.json()["fencingToken"]

        # Both replicas, and a fold of the log from the start, say A holds it.
        async def both_know() -> bool:
            got = [await a.get(f"/v1/leases/{lease['id']}") for a in (a0, a1)]
            return all(g.status_code == 200 and g.json()["id"] == lease["id"] for g in got)

        await until(both_know, what="both replicas to show the retaken lease")
        view = fold(list((await jetstream_store.read(subjects.lease("p1"))).events))
        assert view is not None
        assert view.current is not None
        assert (view.current.lease_id, view.current.client) == (lease["id"], "crawler-a")
        assert view.rejected == 0  # no refused claim was even written
        # B is now refused because A holds it again.
        held = await b1.post("/v1/leases", json=sticky("crawl-1"))
        assert held.status_code == 503
        assert "1 leased" in held.json()["message"]

        # The listing is the fleet's, the same for everyone: the proxy is leased.
        listed = (await b0.get("/v1/proxies/p1")).json()
        assert (listed["leased"], listed["available"]) == (True, False)


async def test_an_idempotent_retry_still_finds_its_first_lease(fleet: Fleet) -> None:
    """A retake is a new lease; the retry of the first request is told its lease ended."""
    async with fleet.as_("crawler-a", 0) as a:
        key = {"Idempotency-Key": "crawl-1-first"}
        first = await a.post("/v1/leases", json=sticky("crawl-1"), headers=key)
        assert first.status_code == 201, first.text
        assert (await a.delete(f"/v1/leases/{first.json()['id']}")).status_code == 204
        again = await a.post("/v1/leases", json=sticky("crawl-1"))
        assert again.status_code == 201, again.text
        assert again.json()["id"] != first.json()["id"]
        retried = await a.post("/v1/leases", json=sticky("crawl-1"), headers=key)
        assert retried.status_code == 409, retried.text
        assert retried.json()["error"] == "lease_ended"


async def test_after_an_expiry_too(fleet: Fleet) -> None:
    async with fleet.as_("crawler-a", 0) as a, fleet.as_("crawler-b", 1) as b:
        first = await a.post("/v1/leases", json=sticky("crawl-1", ttlSeconds=1))
        assert first.status_code == 201, first.text

        async def expired() -> bool:
            return (await a.get(f"/v1/leases/{first.json()['id']}")).status_code == 404

        await until(expired, what="the one-second lease to expire")
        refused_for_the_cooldown(await b.post("/v1/leases", json=sticky("crawl-1")))
        again = await a.post("/v1/leases", json=sticky("crawl-1"))
        assert again.status_code == 201, again.text


async def test_a_waiting_request_of_the_client_gets_its_proxy_when_its_lease_ends(
    fleet: Fleet,
) -> None:
    """The queue wakes a request at the end of its own client's lease, not after the rest
    (which would end after its wait: a 503)."""
    async with fleet.as_("crawler-a", 0) as a:
        first = await a.post("/v1/leases", json=sticky("crawl-1", ttlSeconds=1))
        assert first.status_code == 201, first.text
        waited = await a.post("/v1/leases", json=sticky("crawl-2", waitSeconds=5))
        assert waited.status_code == 201, waited.text


async def test_open_mode_tells_anonymous_crawlers_apart_by_holder(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1", {"country": "de"})
    async with (
        discovery(nats_server.url, lease_cooldown=COOLDOWN) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=10) as api,
    ):
        first = await api.post("/v1/leases", json=sticky("crawl-1"))
        assert first.status_code == 201, first.text
        assert (await api.delete(f"/v1/leases/{first.json()['id']}")).status_code == 204
        refused_for_the_cooldown(await api.post("/v1/leases", json=sticky("crawl-2")))
        refused_for_the_cooldown(await api.post("/v1/leases", json=sticky("")))
        again = await api.post("/v1/leases", json=sticky("crawl-1"))
        assert again.status_code == 201, again.text
        history = await jetstream_store.read(subjects.lease("p1"))
        claims = [r.event for r in history.events if isinstance(r.event, LeaseAcquired)]
        assert [(c.client, c.holder) for c in claims] == [("", "crawl-1"), ("", "crawl-1")]
