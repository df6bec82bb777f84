"""Idempotency-Key against a real nats-server: a retry that reaches a replica whose view has not
seen the first lease yet still gets that lease, through JetStream's stream-wide de-duplication,
and never a second proxy."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from events import subjects
from events.schemas import LeaseAcquired
from services.discovery.leasing.leases import Leases
from services.discovery.observability.metrics import DiscoveryMetrics
from services.discovery.pure.policy import LeasePolicy
from services.discovery.views import Views
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.metrics import Metrics
from tests.support.discovery import discovery, ready_proxy

pytestmark = pytest.mark.integration

KEY = "job-42"
SELECTOR = {"country": "de"}
BODY = {"selector": SELECTOR, "holder": "crawler-7", "ttlSeconds": 60}


async def test_a_retry_on_a_lagging_replica_finds_the_first_lease_in_the_log(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, conn: Connection
) -> None:
    uids = [f"p{i}" for i in range(4)]
    for uid in uids:
        await ready_proxy(jetstream_store, uid, {"country": "de"})
    # The lagging replica: its views caught up before the first lease, and follow only later.
    views = Views(conn.js, jetstream_store)
    await views.catch_up()
    lagging = Leases(
        jetstream_store,
        views,
        LeasePolicy(max_ttl=600, cooldown=0),
        DiscoveryMetrics(Metrics().registry),
        rng=random.Random(3),
    )
    try:
        async with (
            discovery(nats_server.url) as (_, base),
            httpx.AsyncClient(base_url=base, timeout=10) as api,
        ):
            first = await api.post("/v1/leases", json=BODY, headers={"Idempotency-Key": KEY})
            assert first.status_code == 201, first.text
            lease = first.json()

        assert views.find_lease(lease["id"]) is None  # it has not seen the first lease
        follower = asyncio.create_task(views.run())
        try:
            # Its claims meet the first request's msg ids in the log; then, once it has caught
            # up, its view answers on its own. The same lease both times.
            for _ in range(2):
                granted = await lagging.acquire(SELECTOR, 60.0, "crawler-7", key=KEY)
                assert (granted.record.lease_id, granted.view.proxy_uid) == (
                    lease["id"],
                    lease["proxy"]["uid"],
                )
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
    finally:
        await views.close()

    claims = []
    for uid in uids:
        history = await jetstream_store.read(subjects.lease(uid))
        claims += [r.event for r in history.events if isinstance(r.event, LeaseAcquired)]
    assert [c.lease_id for c in claims] == [lease["id"]]  # one claim stored, one proxy taken
