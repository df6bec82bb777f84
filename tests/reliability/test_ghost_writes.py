"""No ghost writes: a lease write the API answered as failed never takes effect later.

With the nats-server killed under a running discovery service, every lease write answers
``503 unavailable`` at once (it used to hang 15 s, answer 500, and then happen anyway when
nats-py sent its buffered publish after the reconnect: a lease granted to nobody). The server is
then restarted on the same store, and the log and the views are checked: nothing the caller was
told had failed holds a proxy. A retry with the same Idempotency-Key gets one lease, not two.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import msgspec
import pytest

from events import codec, subjects
from events.schemas import LeaseAcquired
from projections import lease as lease_fold
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import connect
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, grant_seq, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

PROMPT = 5.0
"""A failed write must be answered well within this (it is about a second; this is a bound on
behaviour, not a benchmark)."""


@pytest.fixture
async def restarted(nats_server: EmbeddedNatsServer) -> AsyncIterator[list[EmbeddedNatsServer]]:
    """Servers a test starts in place of the killed one, stopped at the end."""
    servers: list[EmbeddedNatsServer] = []
    try:
        yield servers
    finally:
        for server in servers:
            await server.stop()


async def restart(old: EmbeddedNatsServer, servers: list[EmbeddedNatsServer]) -> None:
    """The same store and port, as after a crash and a restart of the process."""
    new = EmbeddedNatsServer(data_dir=old.data_dir, port=old.port)
    servers.append(new)
    await new.start()


async def timed(request: asyncio.Future[httpx.Response] | object) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    assert asyncio.iscoroutine(request)
    response: httpx.Response = await request
    return response, time.monotonic() - started


def unavailable(response: httpx.Response, took: float) -> bool:
    return (
        response.status_code == 503
        and response.json()["error"] == "unavailable"
        and int(response.headers["retry-after"]) >= 1
        and took < PROMPT
    )


async def leased_uids(api: httpx.AsyncClient) -> set[str]:
    items = (await api.get("/v1/proxies")).json()["items"]
    return {p["uid"] for p in items if p["leased"]}


async def test_writes_during_an_outage_fail_fast_and_never_take_effect(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    restarted: list[EmbeddedNatsServer],
) -> None:
    for uid in ("p1", "p2", "p3"):
        await ready_proxy(jetstream_store, uid, {"country": "de"})
    async with (
        discovery(nats_server.url) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=30) as api,
    ):
        held = (await api.post("/v1/leases", json={"holder": "before", "ttlSeconds": 600})).json()
        held_uid = held["proxy"]["uid"]

        await nats_server.kill()

        async def down() -> bool:
            return (await api.get("/healthz")).status_code == 503

        await until(down, timeout=10)
        claim = {"selector": {"country": "de"}, "holder": "during", "ttlSeconds": 600}
        keyed = {"Idempotency-Key": "crawler-7-job-42"}
        outcomes = [
            await timed(api.post("/v1/leases", json=claim, headers=keyed)),
            await timed(api.post("/v1/leases", json=claim)),
            await timed(api.delete(f"/v1/leases/{held['id']}")),
            await timed(api.post(f"/v1/leases/{held['id']}/report", json={"outcome": "failed"})),
        ]
        for response, took in outcomes:
            assert unavailable(response, took), (response.request.url, response.text, took)
        # The time passing is what is tested: the server comes back only after the deadline any
        # of them could have carried (its append timeout plus a margin after each write began; no
        # event marks it), so whatever nats-py still sends arrives late.
        await asyncio.sleep(3)

        await restart(nats_server, restarted)

        async def serving() -> bool:
            return (await api.get("/healthz")).status_code == 200

        await until(serving, timeout=30)

        # The log holds the one claim made before the outage, and nothing else.
        async def log_readable() -> bool:
            try:
                await jetstream_store.read(subjects.lease(held_uid))
            except Exception:
                return False
            return True

        await until(log_readable, timeout=30)
        for uid in ("p1", "p2", "p3"):
            events = (await jetstream_store.read(subjects.lease(uid))).events
            expected = [held["id"]] if uid == held_uid else []
            assert [getattr(r.event, "lease_id", "?") for r in events] == expected, uid
        # The views agree: the lease whose release failed still holds, nothing else does.
        assert await leased_uids(api) == {held_uid}
        assert (await api.get(f"/v1/leases/{held['id']}")).status_code == 200

        # The retry the 503 asked for, with the same key: one lease, however often it is sent.
        first = await api.post("/v1/leases", json=claim, headers=keyed)
        assert first.status_code == 201, first.text
        again = await api.post("/v1/leases", json=claim, headers=keyed)
        assert again.status_code == 201, again.text
        assert again.json()["id"] == first.json()["id"]
        assert again.json()["proxy"]["uid"] == first.json()["proxy"]["uid"]
        assert await leased_uids(api) == {held_uid, first.json()["proxy"]["uid"]}

        other_body = await api.post(
            "/v1/leases", json={**claim, "holder": "someone else"}, headers=keyed
        )
        assert other_body.status_code == 422
        assert other_body.json()["error"] == "idempotency_key_mismatch"
        assert (await api.delete(f"/v1/leases/{first.json()['id']}")).status_code == 204
        ended = await api.post("/v1/leases", json=claim, headers=keyed)
        assert ended.status_code == 409
        assert ended.json()["error"] == "lease_ended"


async def test_a_claim_sent_again_after_the_outage_is_ignored_as_late(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    restarted: list[EmbeddedNatsServer],
) -> None:
    """What nats-py does with a publish made while it reconnects: it buffers it and sends it once
    the server is back. A claim that met that fate carries the deadline its writer set, and the
    fold refuses it: the proxy stays free and is leased normally."""
    await ready_proxy(jetstream_store, "p1")
    async with (
        discovery(nats_server.url) as (service, base),
        httpx.AsyncClient(base_url=base, timeout=30) as api,
    ):
        writer = await connect(nats_server.url)
        try:
            await nats_server.kill()

            async def reconnecting() -> bool:
                return not writer.nc.is_connected

            await until(reconnecting, timeout=10)
            # As discovery writes a claim: a deadline its append timeout and margin ahead.
            deadline = datetime.now(UTC) + timedelta(seconds=2.5)
            ghost = LeaseAcquired(
                lease_id="ghost", proxy_uid="p1", ttl_seconds=600, deadline=deadline
            )
            headers = codec.envelope_headers(ghost, "ghost-claim")
            await writer.nc.publish("lease.p1", codec.encode(ghost), headers=headers)

            def past_the_deadline() -> bool:
                return datetime.now(UTC) > deadline

            # The server comes back after the claim's deadline: its stamp is past it.
            await until(past_the_deadline, timeout=10, what="the ghost claim's deadline")
            await restart(nats_server, restarted)

            async def stored() -> bool:
                try:
                    history = await jetstream_store.read(subjects.lease("p1"))
                except Exception:
                    return False
                return bool(history.events)

            await until(stored, timeout=30)
        finally:
            await writer.close()

        (recorded,) = (await jetstream_store.read(subjects.lease("p1"))).events
        assert recorded.event == ghost
        assert recorded.timestamp > deadline  # it did arrive, late
        # Without its deadline it would hold the proxy for ten minutes:
        undated = msgspec.structs.replace(ghost, deadline=msgspec.UNSET)
        without = lease_fold.fold([dataclasses.replace(recorded, event=undated)])
        assert without is not None
        assert without.lease_id == "ghost"

        assert service.api is not None
        views = service.api.views

        async def applied() -> bool:
            return views.leases.last_seq >= recorded.seq

        await until(applied, timeout=30)
        view = views.lease_view("p1")
        assert view is not None
        assert (view.current, view.late, view.granted) == (None, 1, 0)
        got = await api.post("/v1/leases", json={"ttlSeconds": 60})
        assert got.status_code == 201, got.text
        assert got.json()["proxy"]["uid"] == "p1"
        # The first grant on p1 (the ghost granted nothing): the token is its own sequence.
        token = got.json()["fencingToken"]
        assert token == await grant_seq(jetstream_store, "p1", got.json()["id"]) > recorded.seq
