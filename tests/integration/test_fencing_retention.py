"""Fencing tokens survive retention: a real nats-server whose ``LEASE`` stream keeps events for
a second or two instead of 7 days, a discovery replica A running throughout and a replica B
started once early events had aged out (it rebuilds from what is left). Across both, in grant
order, every proxy's tokens strictly increase, also for a proxy idle until all its events aged
out (docs/decisions/0080-fencing-tokens-are-the-grant-s.md).

The replica that was running all along also leases a proxy whose events all aged out: its
view still names the proxy's last sequence, while JetStream then expects 0."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from itertools import pairwise

import httpx
import pytest

from events import subjects
from projections.lease import LeaseView
from services.discovery.service import DiscoveryService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import STREAMS
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, grant_seq, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

MAX_AGE = 1.5
"""The short-lived ``LEASE``'s retention, in seconds (the product's is 7 days)."""

BUSY, IDLE = "busy", "idle"


@pytest.fixture
async def short_lived(nats_server: EmbeddedNatsServer) -> AsyncIterator[Connection]:
    """The product's streams, ``LEASE`` with a retention of ``MAX_AGE`` (its duplicate window
    may not be longer); created before anything else, so nothing creates the 7-day one."""
    conn = await connect(nats_server.url)
    try:
        for spec in STREAMS:
            short = dataclasses.replace(spec, max_age=MAX_AGE, duplicate_window=MAX_AGE)
            made = short if spec.name == subjects.LEASE_STREAM else spec
            await conn.js.add_stream(made.config(replicas=1))
        yield conn
    finally:
        await conn.close()


async def first_seq(conn: Connection) -> int:
    return (await conn.js.stream_info(subjects.LEASE_STREAM)).state.first_seq


class Grants:
    """Every lease granted, in grant order: (proxy, token, the grant's sequence in the log)."""

    def __init__(self, store: JetStreamEventStore) -> None:
        self.store = store
        self.seen: list[tuple[str, int, int]] = []

    async def lease(self, client: httpx.AsyncClient, uid: str) -> int:
        """Lease ``uid`` through ``client`` and release it; the sequence of the release."""
        got = await client.post("/v1/leases", json={"proxyUid": uid, "ttlSeconds": 60})
        assert got.status_code == 201, got.text
        lease = got.json()
        # Read before it can age out: the token is the grant's own sequence.
        seq = await grant_seq(self.store, uid, lease["id"])
        self.seen.append((uid, lease["fencingToken"], seq))
        assert (await client.delete(f"/v1/leases/{lease['id']}")).status_code == 204
        return (await self.store.read(subjects.lease(uid))).last_seq

    def tokens(self, uid: str) -> list[int]:
        return [token for proxy, token, _ in self.seen if proxy == uid]


async def proxies_seen(client: httpx.AsyncClient) -> bool:
    return len((await client.get("/v1/proxies")).json()["items"]) == 2


def lease_view(service: DiscoveryService, uid: str) -> LeaseView:
    assert service.api is not None
    view = service.api.views.lease_view(uid)
    assert view is not None
    return view


async def early_leases_then_age_out(grants: Grants, a: httpx.AsyncClient, conn: Connection) -> None:
    """Lease both proxies on A, then keep leasing the busy one until every early event has aged
    out: the stream then holds the busy proxy's recent history only, and nothing of the idle
    one."""
    await until(lambda: proxies_seen(a), what="the proxies on A")
    for _ in range(3):
        await grants.lease(a, IDLE)
    early = max(await grants.lease(a, IDLE), await grants.lease(a, BUSY))

    async def aged_out() -> bool:
        await grants.lease(a, BUSY)
        return await first_seq(conn) > early

    await until(aged_out, timeout=30, every=0.2, what="the early events to age out")
    assert not (await grants.store.read(subjects.lease(IDLE))).events


def assert_increasing(grants: Grants) -> None:
    for uid in (BUSY, IDLE):
        tokens = grants.tokens(uid)
        assert all(a < b for a, b in pairwise(tokens)), (uid, tokens)
    # Every token, on either replica, before and after the age-out, is its grant's sequence.
    assert all(token == seq for _, token, seq in grants.seen), grants.seen


async def test_tokens_keep_increasing_after_events_age_out_on_old_and_new_replicas(
    nats_server: EmbeddedNatsServer, short_lived: Connection
) -> None:
    store = JetStreamEventStore(short_lived.nc, short_lived.js)
    for uid in (BUSY, IDLE):
        await ready_proxy(store, uid)
    grants = Grants(store)
    async with (
        discovery(nats_server.url) as (service_a, base_a),
        httpx.AsyncClient(base_url=base_a, timeout=10) as a,
    ):
        await early_leases_then_age_out(grants, a, short_lived)
        # B starts fresh and rebuilds from what is left; it leases the idle proxy first (the
        # proxy that "started again at 1"), then both replicas lease both proxies in turn.
        async with (
            discovery(nats_server.url) as (service_b, base_b),
            httpx.AsyncClient(base_url=base_b, timeout=10) as b,
        ):
            await until(lambda: proxies_seen(b), what="the proxies on B")
            for client in (b, a, b, a):
                await grants.lease(client, IDLE)
                await grants.lease(client, BUSY)
            for uid in (BUSY, IDLE):

                def level(uid: str = uid) -> bool:
                    return (
                        lease_view(service_b, uid).last_seq == lease_view(service_a, uid).last_seq
                    )

                await until(level, what=f"both views of {uid} at the same sequence")
                # B counted fewer grants than A (a count would have given smaller tokens),
                # and still agrees with A on the token.
                on_a, on_b = lease_view(service_a, uid), lease_view(service_b, uid)
                assert on_b.granted < on_a.granted, uid
                assert on_b.fencing_token == on_a.fencing_token, uid

    assert len(grants.tokens(IDLE)) == 4 + 4
    assert len(grants.tokens(BUSY)) > 2 + 4
    assert_increasing(grants)


async def test_the_running_replica_leases_a_proxy_whose_events_all_aged_out(
    nats_server: EmbeddedNatsServer, short_lived: Connection
) -> None:
    store = JetStreamEventStore(short_lived.nc, short_lived.js)
    for uid in (BUSY, IDLE):
        await ready_proxy(store, uid)
    grants = Grants(store)
    async with (
        discovery(nats_server.url) as (_, base_a),
        httpx.AsyncClient(base_url=base_a, timeout=10) as a,
    ):
        await early_leases_then_age_out(grants, a, short_lived)
        await grants.lease(a, IDLE)
    assert len(grants.tokens(IDLE)) == 4 + 1
    assert_increasing(grants)
