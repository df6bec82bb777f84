"""A spec change of a leased proxy is made before it is broken, like a rotation; an unleased
proxy's is still delete-first (docs/decisions/0085-a-fresh-ip-without-downtime.md). Real
nats-server, reconciler and executor; the fake provider, since the Squid is not the point; the test
plays the health service for the replacement."""

from __future__ import annotations

import asyncio

import pytest

from events import subjects
from events.schemas import ReplacementStarted
from services.reconciler.service import ReconcilerService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from services.testing.provider import FakeProvider
from tests.support.lifecycle import fleet, start, view
from tests.support.rotation import declared, judge_healthy, leased, replacement_running, serving
from tests.support.rotation import token as fencing_token
from tests.support.waiting import until

pytestmark = pytest.mark.integration


async def test_a_spec_change_replaces_a_leased_proxy_first_and_an_unleased_one_delete_first(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    store = jetstream_store
    fake = FakeProvider(pending_polls=1)
    tasks: list[asyncio.Task[None]] = []
    async with fleet(nats_server.url, {"fake": fake}, reconcilers=0):
        try:
            await start(nats_server.url, ReconcilerService(rotation_drain=0.3), tasks)
            held = await declared(store, "fake", "held")
            free = await declared(store, "fake", "free")
            held_before = await serving(store, held)
            free_before = await serving(store, free)
            token = await leased(store, held)

            await declared(store, "fake", "held", zone="b")
            await declared(store, "fake", "free", zone="b")
            new = await replacement_running(store, held)
            assert fake.live_per_owner()[held] == 2  # the old one still serves the lease
            await judge_healthy(store, held, new)

            async def settled() -> bool:
                held_now, free_now = await view(store, held), await view(store, free)
                return (
                    fake.live_per_owner().get(held) == 1
                    and held_now is not None
                    and held_now.provider_id == new
                    and free_now is not None
                    and free_now.phase.value == "Ready"
                    and free_now.provider_id != free_before.provider_id
                )

            await until(settled, timeout=60)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert held_before.provider_id != new
    assert await fencing_token(store, held) > token
    assert fake.max_live_per_owner[free] == 1  # delete-first: never two
    assert fake.live_per_owner() == {held: 1, free: 1}
    started = [
        r.event
        for r in (await store.read(subjects.proxy(held))).events
        if isinstance(r.event, ReplacementStarted)
    ]
    assert [s.reason for s in started] == ["SpecChanged"]
    free_history = (await store.read(subjects.proxy(free))).events
    assert not any(isinstance(r.event, ReplacementStarted) for r in free_history)
