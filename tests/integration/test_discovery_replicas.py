"""Discovery replicas: a new one catches up before serving, replicas share the expiry work, and
views rebuilt from sequence 1 equal the live ones."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import httpx
import pytest

from events import subjects
from events.schemas import LeaseExpired
from projections import lease as lease_fold
from projections import proxy as proxy_fold
from services.discovery.service import DiscoveryService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.projector import Projector
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy, set_health
from tests.support.expiry_sweeps import count_sweeps  # noqa: F401  # the fixture `sweeps`
from tests.support.waiting import until

pytestmark = pytest.mark.integration


def at(value: str) -> datetime:
    return datetime.fromisoformat(value)


def gone(response: httpx.Response) -> bool:
    return response.status_code == 404 and response.json()["error"] == "unknown_lease"


async def _has_proxies(api: httpx.AsyncClient, n: int) -> bool:
    return len((await api.get("/v1/proxies")).json()["items"]) >= n


async def test_a_new_replica_catches_up_before_serving(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    async with (
        discovery(nats_server.url) as (_, first),
        httpx.AsyncClient(base_url=first) as client,
    ):
        await until(lambda: _has_proxies(client, 1))
        lease = (await client.post("/v1/leases", json={"holder": "a", "ttlSeconds": 60})).json()
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
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, sweeps: Counter[int]
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
            (await client.post("/v1/leases", json={"ttlSeconds": 1})).json() for client in (a, b, a)
        ]
        assert len({lease["proxy"]["uid"] for lease in leases}) == 3

        async def all_recorded() -> bool:
            for uid in ("p1", "p2", "p3"):
                history = await jetstream_store.read(subjects.lease(uid))
                if not any(isinstance(r.event, LeaseExpired) for r in history.events):
                    return False
            return True

        await until(all_recorded, timeout=10)
        for client in (a, b):
            for lease in leases:
                assert gone(await client.get(f"/v1/leases/{lease['id']}"))
        # A second LeaseExpired would come from a later sweep: let each replica make ten more.
        after = dict(sweeps)
        assert len(after) == 2, "both replicas sweep"

        def ten_more() -> bool:
            return all(sweeps[replica] >= done + 10 for replica, done in after.items())

        await until(ten_more, timeout=10, what="ten more sweeps on each replica")
    for uid in ("p1", "p2", "p3"):
        history = await jetstream_store.read(subjects.lease(uid))
        expired = [r for r in history.events if isinstance(r.event, LeaseExpired)]
        assert len(expired) == 1, uid
        # Recorded after the end, never before: the fold would ignore an early one anyway.
        lease = next(x for x in leases if x["proxy"]["uid"] == uid)
        assert expired[0].timestamp >= at(lease["expiresAt"]) - timedelta(milliseconds=1)


async def test_rebuilt_views_equal_the_live_ones(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, conn: Connection
) -> None:
    for uid in ("p1", "p2", "p3"):
        await ready_proxy(jetstream_store, uid, {"pool": uid})
    async with (
        discovery(nats_server.url, lease_cooldown=0.5) as (service, base),
        httpx.AsyncClient(base_url=base) as api,
    ):
        assert service.api is not None
        views = service.api.views
        one = (await api.post("/v1/leases", json={"selector": {"pool": "p1"}})).json()
        two = (await api.post("/v1/leases", json={"ttlSeconds": 1, "holder": "h"})).json()
        await api.post(f"/v1/leases/{one['id']}/report", json={"outcome": "blocked"})
        assert (await api.delete(f"/v1/leases/{one['id']}")).status_code == 204
        await set_health(jetstream_store, "p3", False)

        async def two_recorded_as_expired() -> bool:
            return two["id"] not in {v.lease_id for v in views.leases.views.values()}

        await until(two_recorded_as_expired, timeout=10)
        # The cooldowns run out: some proxy becomes free again.
        granted: list[httpx.Response] = []

        async def acquired() -> bool:
            answer = await api.post("/v1/leases", json={"ttlSeconds": 7200})
            assert answer.status_code in (201, 503), answer.text
            granted.append(answer)
            return answer.status_code == 201

        await until(acquired, timeout=10, every=0.1)
        three = granted[-1]
        assert three.status_code == 201, three.text
        lease_end = (await conn.js.stream_info(subjects.LEASE_STREAM)).state.last_seq
        proxy_end = (await conn.js.stream_info(subjects.PROXY_STREAM)).state.last_seq

        async def live_is_current() -> bool:
            return views.leases.last_seq >= lease_end and views.proxies.last_seq >= proxy_end

        await until(live_is_current)
        leases = Projector(conn.js, subjects.LEASE_STREAM, "lease.*", lease_fold.apply)
        proxies = Projector(conn.js, subjects.PROXY_STREAM, "proxy.*.*", proxy_fold.apply)
        for rebuilt in (leases, proxies):
            await rebuilt.catch_up()
            await rebuilt.close()
        assert leases.views == views.leases.views
        assert proxies.views == views.proxies.views
        assert any(isinstance(v.current, lease_fold.LeaseRecord) for v in leases.views.values())
        assert two["id"] not in {v.lease_id for v in leases.views.values()}
