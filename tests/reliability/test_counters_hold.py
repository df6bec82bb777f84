"""A quota is a quota (docs/decisions/0135-counters-that-hold.md): real discovery replicas on a
real nats-server, a client with ``maxLeases: 2``. Twelve acquires at once are granted two, the
rest refused ``lease_limit``; eight waiting ones are granted what the limit leaves; a retry with
the same Idempotency-Key at the limit gets its lease; two replicas grant one lease over the limit
at most; and a pool's demand counts the client for no more than it may still lease."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from events import subjects
from events.pool import Autoscale, PoolFigures
from events.poolresource import pool_uid
from events.store import EventStore
from projections import lease as lease_fold
from projections import pool_demand
from services.discovery.service import DiscoveryService
from services.pools.pure.autoscale import wanted
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.pure.clients import hash_token
from tests.support.discovery import bearer_client, discovery, ready_proxy
from tests.support.discovery_pools import declare_pool, member, member_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

TOKENS = {"crawler": "c" * 40, "ops": "o" * 40}
LIMIT = 2


def clients_yaml() -> str:
    return (
        "clients:\n"
        f"  - {{name: crawler, token: '{hash_token(TOKENS['crawler'])}', scopes: [lease, read],"
        f" maxLeases: {LIMIT}}}\n"
        f"  - {{name: ops, token: '{hash_token(TOKENS['ops'])}', scopes: [admin]}}\n"
    )


@dataclass
class Replicas:
    services: list[DiscoveryService]
    urls: list[str]

    def as_(self, name: str, replica: int = 0) -> httpx.AsyncClient:
        return bearer_client(self.urls[replica], TOKENS[name], timeout=30)


@pytest.fixture
async def two(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> AsyncIterator[Replicas]:
    for i in range(14):
        await ready_proxy(jetstream_store, f"p{i}", {"country": "de"})
    file = tmp_path / "clients.yaml"
    file.write_text(clients_yaml())
    async with (
        discovery(nats_server.url, clients_file=file) as (first, one),
        discovery(nats_server.url, clients_file=file) as (second, other),
    ):
        yield Replicas([first, second], [one, other])


async def granted_to(store: EventStore, client: str) -> int:
    """Leases the log granted ``client`` (claims the fold refused are not counted)."""
    granted = 0
    for i in range(14):
        history = await store.read(subjects.lease(f"p{i}"))
        view = lease_fold.fold(history.events, None)
        if view is not None:
            records = [*view.recent, *([view.current] if view.current else [])]
            granted += sum(1 for r in records if r.client == client)
    return granted


def body(holder: str, **extra: object) -> dict[str, object]:
    return {"selector": {"country": "de"}, "holder": holder, **extra}


async def test_twelve_acquires_at_once_are_granted_the_limit_and_no_more(
    two: Replicas, jetstream_store: JetStreamEventStore
) -> None:
    async with two.as_("crawler") as crawler:
        answers = await asyncio.gather(
            *(crawler.post("/v1/leases", json=body(f"h{i}")) for i in range(12))
        )
    statuses = Counter(a.status_code for a in answers)
    assert statuses == {201: LIMIT, 429: 12 - LIMIT}, [a.text for a in answers]
    refused = [a for a in answers if a.status_code == 429]
    assert {a.json()["error"] for a in refused} == {"lease_limit"}
    assert all(a.headers["retry-after"] == "1" for a in refused)
    assert await granted_to(jetstream_store, "crawler") == LIMIT  # nothing more in the log


async def test_two_replicas_grant_one_lease_over_the_limit_at_most(
    two: Replicas, jetstream_store: JetStreamEventStore
) -> None:
    async with two.as_("crawler", 0) as one, two.as_("crawler", 1) as other:
        answers = await asyncio.gather(
            *((one if i % 2 else other).post("/v1/leases", json=body(f"h{i}")) for i in range(12))
        )
    granted = sum(1 for a in answers if a.status_code == 201)
    assert LIMIT <= granted <= LIMIT + 1, [a.text for a in answers]
    assert {a.json()["error"] for a in answers if a.status_code != 201} == {"lease_limit"}
    assert await granted_to(jetstream_store, "crawler") == granted


async def test_waiting_requests_are_granted_what_the_limit_leaves(
    two: Replicas, jetstream_store: JetStreamEventStore
) -> None:
    async with two.as_("ops") as ops, two.as_("crawler") as crawler:
        taken = [await ops.post("/v1/leases", json=body(f"ops-{i}")) for i in range(14)]
        assert {t.status_code for t in taken} == {201}
        first = await crawler.post("/v1/leases", json=body("early", waitSeconds=0))
        assert first.status_code == 503  # every proxy is the admin's
        waiting = [
            asyncio.create_task(crawler.post("/v1/leases", json=body(f"w{i}", waitSeconds=20)))
            for i in range(8)
        ]
        done, _ = await asyncio.wait(waiting, timeout=3)
        # The limit's two wait; the other six are told at once.
        assert sorted(t.result().status_code for t in done) == [429] * (8 - LIMIT)
        for t in taken:
            assert (await ops.delete(f"/v1/leases/{t.json()['id']}")).status_code == 204
        answers = [await t for t in waiting]
    assert Counter(a.status_code for a in answers) == {201: LIMIT, 429: 8 - LIMIT}
    assert await granted_to(jetstream_store, "crawler") == LIMIT


async def test_a_retry_with_the_same_key_at_the_limit_gets_its_lease(two: Replicas) -> None:
    async with two.as_("crawler", 0) as one, two.as_("crawler", 1) as other:
        first = await one.post("/v1/leases", json=body("a"), headers={"Idempotency-Key": "k-a"})
        second = await one.post("/v1/leases", json=body("b"), headers={"Idempotency-Key": "k-b"})
        assert (first.status_code, second.status_code) == (201, 201)
        again = await one.post("/v1/leases", json=body("a"), headers={"Idempotency-Key": "k-a"})
        assert again.status_code == 201, again.text
        assert again.json()["id"] == first.json()["id"]
        # On the other replica too, however fresh its view.
        there = await other.post("/v1/leases", json=body("b"), headers={"Idempotency-Key": "k-b"})
        assert there.status_code == 201, there.text
        assert there.json()["id"] == second.json()["id"]
        # A new key at the limit is still refused, and an old key with another body too.
        new = await one.post("/v1/leases", json=body("c"), headers={"Idempotency-Key": "k-c"})
        assert new.status_code == 429
        changed = await one.post("/v1/leases", json=body("x"), headers={"Idempotency-Key": "k-a"})
        assert changed.status_code == 422
        # Retries sent at once with one key are one request: one lease, never two.
        await one.delete(f"/v1/leases/{first.json()['id']}")
        burst = await asyncio.gather(
            *(
                one.post("/v1/leases", json=body("d"), headers={"Idempotency-Key": "k-d"})
                for _ in range(5)
            )
        )
    assert {b.status_code for b in burst} == {201}, [b.text for b in burst]
    assert len({b.json()["id"] for b in burst}) == 1


# --------------------------------------------------------------------------- pool demand

DE = pool_uid("crawl", "de")
AUTOSCALE = Autoscale(min=1, max=10, target_leased=1.0)


async def test_a_pools_demand_counts_a_client_at_most_its_limit(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    """Holding one member and waiting under 40 holder names, then granted the other member: its
    leased members and its unserved holders together stay within its limit, so the pool is
    not asked for a third member the client could never lease."""
    members = (member("de", "crawl", DE, 0, "local"), member("de", "crawl", DE, 1, "local"))
    await declare_pool(jetstream_store, DE, "crawl", "de", members, autoscale=AUTOSCALE)
    for planned in members:
        await member_proxy(jetstream_store, "de", planned)
    file = tmp_path / "clients.yaml"
    file.write_text(clients_yaml())
    pool = {"pool": "crawl/de"}
    async with discovery(nats_server.url, clients_file=file) as (service, url):
        replicas = Replicas([service], [url])
        async with replicas.as_("crawler") as crawler, replicas.as_("ops") as ops:
            mine = await crawler.post("/v1/leases", json={"holder": "h-first", **pool})
            theirs = await ops.post("/v1/leases", json={"holder": "ops", **pool})
            assert (mine.status_code, theirs.status_code) == (201, 201)
            waiting = [
                asyncio.create_task(
                    crawler.post("/v1/leases", json={"holder": f"h{i}", "waitSeconds": 8, **pool})
                )
                for i in range(40)
            ]
            assert service.api is not None

            def all_in() -> bool:
                """Every request waits or was answered (over the limit: 429 at once)."""
                assert service.api is not None
                answered = sum(task.done() for task in waiting)
                return service.api.leases.queue.waiting + answered == len(waiting)

            await until(all_in, timeout=10, what="every request waiting or answered")
            assert (await ops.delete(f"/v1/leases/{theirs.json()['id']}")).status_code == 204

            async def holds_both() -> bool:
                page = (await crawler.get("/v1/pools/crawl/de")).json()
                return bool(page["leased"] == 2)

            await until(holds_both, timeout=10, what="the crawler to hold both members")
            await service.api.leases.demand.report_once()
            # Nothing reported is a demand of nothing.
            history = await jetstream_store.read(subjects.demand(DE))
            view = None
            for recorded in history.events:
                view = pool_demand.apply(view, recorded)
            demand = pool_demand.current(view, service.api.views.now())
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
    desired = wanted(AUTOSCALE, PoolFigures(leased=2), demand)
    assert desired <= LIMIT, (demand, desired)
