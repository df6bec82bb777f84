"""Renewal on two discovery replicas and a real nats-server: it keeps the fencing token, moves
``expiresAt`` on every replica, outlives the old end (the sweep honours the new one), and when
it races a release or an expiry on the other replica the log decides, never both."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from functools import partial

import httpx
import pytest

from events import subjects
from events.schemas import LeaseExpired, LeaseRenewed
from projections import lease as lease_fold
from projections import lease_queries
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy
from tests.support.expiry_sweeps import count_sweeps  # noqa: F401  # the fixture `sweeps`
from tests.support.waiting import until

pytestmark = pytest.mark.integration

Pair = tuple[httpx.AsyncClient, httpx.AsyncClient]


def at(value: str) -> datetime:
    return datetime.fromisoformat(value)


def same_instant(recorded: datetime, shown: str) -> bool:
    """The store's reader and the projector round JetStream's nanoseconds apart by 1 us."""
    return abs(recorded - at(shown)) <= timedelta(microseconds=1)


def gone(response: httpx.Response) -> bool:
    return response.status_code == 404 and response.json()["error"] == "unknown_lease"


@pytest.fixture
async def pair(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, sweeps: Counter[int]
) -> AsyncIterator[Pair]:
    for uid in ("p1", "p2", "p3"):
        await ready_proxy(jetstream_store, uid, {"country": "de"})
    async with (
        discovery(nats_server.url, max_lease_ttl=120.0, expiry_interval=0.05) as (_, first),
        discovery(nats_server.url, max_lease_ttl=120.0, expiry_interval=0.05) as (_, second),
        httpx.AsyncClient(base_url=first, timeout=10) as a,
        httpx.AsyncClient(base_url=second, timeout=10) as b,
    ):
        for client in (a, b):

            async def seen(c: httpx.AsyncClient = client) -> bool:
                return len((await c.get("/v1/proxies")).json()["items"]) == 3

            await until(seen, what="three proxies on each replica")
        yield a, b


async def _shows(client: httpx.AsyncClient, lease_id: str, expires_at: str) -> bool:
    got = await client.get(f"/v1/leases/{lease_id}")
    return got.status_code == 200 and got.json()["expiresAt"] == expires_at


async def test_renewal_keeps_the_token_and_moves_expires_at_on_every_replica(
    pair: Pair, jetstream_store: JetStreamEventStore
) -> None:
    a, b = pair
    lease = (await a.post("/v1/leases", json={"ttlSeconds": 30, "holder": "c1"})).json()
    assert lease["renewedAt"] is None
    # A replica answers from its view of the log, which follows it by milliseconds: B renews
    # the lease once it knows it (a renewal B cannot place yet is a 404, docs/api.md).
    await until(lambda: _shows(b, lease["id"], lease["expiresAt"]), what="the lease on B")
    renewed = await b.patch(f"/v1/leases/{lease['id']}", json={"ttlSeconds": 90})
    assert renewed.status_code == 200, renewed.json()
    body = renewed.json()
    assert (body["id"], body["fencingToken"], body["proxy"]["uid"], body["holder"]) == (
        lease["id"],
        lease["fencingToken"],
        lease["proxy"]["uid"],
        "c1",
    )
    assert body["acquiredAt"] == lease["acquiredAt"]
    assert at(body["expiresAt"]) - at(body["renewedAt"]) == timedelta(seconds=90)
    assert at(body["expiresAt"]) > at(lease["expiresAt"])
    assert (body["ttlSeconds"], body["ttlClamped"]) == (90, False)
    await until(lambda: _shows(a, lease["id"], body["expiresAt"]), what="the renewal on A")
    # Above the maximum: clamped, as a lease request is; a renewal may also shorten the lease.
    clamped = (await a.patch(f"/v1/leases/{lease['id']}", json={"ttlSeconds": 600})).json()
    assert (clamped["ttlSeconds"], clamped["ttlClamped"]) == (120, True)
    shorter = (await a.patch(f"/v1/leases/{lease['id']}", json={})).json()
    assert at(shorter["expiresAt"]) - at(shorter["renewedAt"]) == timedelta(seconds=120)
    history = await jetstream_store.read(subjects.lease(lease["proxy"]["uid"]))
    assert sum(isinstance(r.event, LeaseRenewed) for r in history.events) == 3
    for bad in ({"ttlSeconds": "60"}, {"ttlSeconds": 0.5}, {"ttlSeconds": 1e6}, {"ttl": 60}):
        refused = await b.patch(f"/v1/leases/{lease['id']}", json=bad)
        assert refused.status_code == 400, bad
        assert refused.json()["error"] == "invalid_request"
        assert next(iter(bad)) in refused.json()["message"], refused.json()
    assert (await a.delete(f"/v1/leases/{lease['id']}")).status_code == 204
    assert gone(await b.patch(f"/v1/leases/{lease['id']}", json={"ttlSeconds": 60}))
    assert gone(await b.patch("/v1/leases/never-issued", json={"ttlSeconds": 60}))


async def test_a_renewed_lease_outlives_its_old_end_and_the_sweeps(
    pair: Pair, jetstream_store: JetStreamEventStore, sweeps: Counter[int]
) -> None:
    a, b = pair
    lease = (await a.post("/v1/leases", json={"ttlSeconds": 2})).json()
    renewed = (await b.patch(f"/v1/leases/{lease['id']}", json={"ttlSeconds": 60})).json()
    old_end = at(lease["expiresAt"])
    await until(lambda: datetime.now(UTC) > old_end, what="the old end")
    after = dict(sweeps)
    assert len(after) == 2, "both replicas sweep"
    await until(
        lambda: all(sweeps[r] >= n + 5 for r, n in after.items()),
        what="five more sweeps on each replica after the old end",
    )
    for client in (a, b):
        assert await _shows(client, lease["id"], renewed["expiresAt"])
    history = await jetstream_store.read(subjects.lease(lease["proxy"]["uid"]))
    assert not any(isinstance(r.event, LeaseExpired) for r in history.events)


async def test_an_expired_lease_cannot_be_renewed(pair: Pair) -> None:
    a, b = pair
    lease = (await a.post("/v1/leases", json={"ttlSeconds": 1})).json()

    async def ended() -> bool:
        return gone(await b.get(f"/v1/leases/{lease['id']}"))

    await until(ended, what="the lease to expire")
    assert gone(await b.patch(f"/v1/leases/{lease['id']}", json={"ttlSeconds": 60}))


def _reached(when: datetime) -> bool:
    return datetime.now(UTC) >= when


async def _final(store: JetStreamEventStore, uid: str, lease_id: str) -> lease_fold.LeaseRecord:
    view = lease_fold.fold((await store.read(subjects.lease(uid))).events)
    record = lease_queries.find(view, lease_id)
    assert record is not None
    return record


async def test_a_renewal_racing_a_release_on_the_other_replica_is_decided_by_the_log(
    pair: Pair, jetstream_store: JetStreamEventStore
) -> None:
    a, b = pair
    for _ in range(6):
        lease = (await a.post("/v1/leases", json={"ttlSeconds": 60})).json()
        renewal, release = await asyncio.gather(
            a.patch(f"/v1/leases/{lease['id']}", json={"ttlSeconds": 90}),
            b.delete(f"/v1/leases/{lease['id']}"),
        )
        assert release.status_code == 204
        record = await _final(jetstream_store, lease["proxy"]["uid"], lease["id"])
        assert record.end == lease_fold.RELEASED
        if renewal.status_code == 200:
            # Counted, so it came before the release in the log, with the end it answered.
            assert record.renewed_seq > 0
            assert same_instant(record.expires_at, renewal.json()["expiresAt"])
        else:
            assert gone(renewal), renewal.json()
            assert record.renewed_seq == 0
        for client in (a, b):
            assert gone(await client.get(f"/v1/leases/{lease['id']}"))


async def test_a_renewal_racing_the_expiry_is_decided_by_the_log(
    pair: Pair, jetstream_store: JetStreamEventStore
) -> None:
    a, b = pair
    for _ in range(4):
        lease = (await a.post("/v1/leases", json={"ttlSeconds": 1})).json()
        end = at(lease["expiresAt"])
        near = end - timedelta(milliseconds=30)
        await until(partial(_reached, near), every=0.005, what="near the end")
        renewal = await b.patch(f"/v1/leases/{lease['id']}", json={"ttlSeconds": 30})
        record = await _final(jetstream_store, lease["proxy"]["uid"], lease["id"])
        if renewal.status_code == 200:
            assert record.end == ""
            assert same_instant(record.expires_at, renewal.json()["expiresAt"])
            lease_id, new_end = lease["id"], renewal.json()["expiresAt"]
            for client in (a, b):
                await until(partial(_shows, client, lease_id, new_end))
            assert (await a.delete(f"/v1/leases/{lease['id']}")).status_code == 204
        else:
            assert gone(renewal), renewal.json()
            history = await jetstream_store.read(subjects.lease(lease["proxy"]["uid"]))
            view = lease_fold.fold(history.events)
            # Over at its first end, renewed never: whatever the order the log put them in.
            assert lease_queries.active(view, lease["id"], end + timedelta(microseconds=2)) is None
            assert record.renewed_seq == 0
            assert same_instant(record.expires_at, lease["expiresAt"])
