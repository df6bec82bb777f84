"""A durable changed or deleted behind the service's back, against a real nats-server: two
replicas of the reconciler's loop, logged in as the reconciler, notice within their check
interval, count it, and restore the durable from the last ack floor they saw, so every message
appended meanwhile is handled and none acknowledged before is handled again (docs/decisions/,
D93)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.consumer import ConsumerLoop, Delivery, Handler, Outcome
from services.runtime.nats.durable import RESTORED, filters
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.metrics import Metrics
from tests.support.waiting import until
from tests.support.workload import effect_handler, effects, publish_inputs, spec

pytestmark = pytest.mark.integration

DURABLE = "reconciler"
STREAM = "PROXY"
FIRST = [f"a{i}" for i in range(6)]
MEANWHILE = [f"b{i}" for i in range(6)]


@dataclass
class Replica:
    conn: Connection
    loop: ConsumerLoop
    metrics: Metrics
    task: asyncio.Task[None]

    def drifts(self, kind: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "egress_consumer_drift_total", {"consumer": DURABLE, "kind": kind}
        )
        return value or 0.0


@pytest.fixture
async def replicas(
    nats_server: EmbeddedNatsServer, conn: Connection
) -> AsyncIterator[tuple[list[Replica], Counter[str]]]:
    """Two replicas sharing the durable; the counter holds how often each input was handled."""
    handled: Counter[str] = Counter()
    running: list[Replica] = []
    for _ in range(2):
        mine = await connect(nats_server.url, credentials=nats_server.credentials_for(DURABLE))
        store = JetStreamEventStore(mine.nc, mine.js)
        effect: Callable[[Delivery], Awaitable[Outcome]] = effect_handler(store)  # type: ignore[assignment]

        async def counted(
            delivery: Delivery, effect: Callable[[Delivery], Awaitable[Outcome]] = effect
        ) -> Outcome:
            handled[delivery.recorded.msg_id] += 1
            return await effect(delivery)

        handler: Handler = counted
        metrics = Metrics()
        loop = ConsumerLoop(
            mine, spec(DURABLE, check_interval=0.5), handler, store=store, metrics=metrics
        )
        running.append(Replica(mine, loop, metrics, asyncio.create_task(loop.run())))
    try:
        yield running, handled
    finally:
        for replica in running:
            replica.task.cancel()
            await asyncio.gather(replica.task, return_exceptions=True)
            await replica.conn.close()


async def handled_first_batch(
    conn: Connection, store: JetStreamEventStore, running: list[Replica]
) -> None:
    """The first inputs handled, and their ack floor seen by every replica's check."""
    await publish_inputs(store, FIRST)

    async def all_done() -> bool:
        return all((await effects(store, FIRST)).values())

    await until(all_done, timeout=30, what="the first inputs handled")

    async def floor_seen() -> bool:
        info = await conn.js.consumer_info(STREAM, DURABLE)
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        return info.num_ack_pending == 0 and all(
            (r.loop.guard.floor or 0) >= floor > 0 for r in running
        )

    await until(floor_seen, timeout=30, what="each replica to see the ack floor")


async def handled_meanwhile(store: JetStreamEventStore, handled: Counter[str]) -> None:
    await publish_inputs(store, MEANWHILE)

    async def all_done() -> bool:
        return all((await effects(store, MEANWHILE)).values())

    await until(all_done, timeout=30, what="the inputs appended meanwhile handled")
    assert await effects(store, FIRST + MEANWHILE) == {
        uid: [f"in-{uid}-0"] for uid in FIRST + MEANWHILE
    }
    # Restored from the ack floor, not from the first event: nothing handled twice.
    assert all(handled[f"in-{uid}-0"] == 1 for uid in FIRST), handled


async def declared_again(conn: Connection) -> ConsumerConfig:
    info = await conn.js.consumer_info(STREAM, DURABLE)
    assert filters(info.config) == {"proxy.*.health"}
    assert info.config.deliver_policy == DeliverPolicy.BY_START_SEQUENCE
    assert RESTORED in (info.config.metadata or {})
    config: ConsumerConfig = info.config
    return config


async def test_a_retargeted_filter_is_noticed_and_nothing_appended_meanwhile_is_lost(
    conn: Connection,
    jetstream_store: JetStreamEventStore,
    replicas: tuple[list[Replica], Counter[str]],
) -> None:
    running, handled = replicas
    await handled_first_batch(conn, jetstream_store, running)
    # As the admin, the change the gc user could make before D93: the durable now waits for
    # subjects nobody writes, with nothing pending.
    config = (await conn.js.consumer_info(STREAM, DURABLE)).config
    config.filter_subjects = ["proxy.*.gone"]
    await conn.js.add_consumer(STREAM, config)
    await handled_meanwhile(jetstream_store, handled)
    assert sum(r.drifts("filter") for r in running) >= 1
    # A restore deletes, then creates: a sibling checking in between finds it gone and restores
    # it from its own floor, which the assertions above show loses and repeats nothing. Only a
    # sibling can see that, never the replica that restores.
    assert sum(r.drifts("vanished") for r in running) <= len(running) - 1
    await declared_again(conn)


async def test_a_deleted_durable_is_noticed_and_restored_from_the_ack_floor(
    conn: Connection,
    jetstream_store: JetStreamEventStore,
    replicas: tuple[list[Replica], Counter[str]],
) -> None:
    running, handled = replicas
    await handled_first_batch(conn, jetstream_store, running)
    floor = max(r.loop.guard.floor or 0 for r in running)
    await conn.js.delete_consumer(STREAM, DURABLE)
    await handled_meanwhile(jetstream_store, handled)
    assert sum(r.drifts("vanished") for r in running) >= 1
    config = await declared_again(conn)
    assert (config.opt_start_seq or 0) <= floor + 1


async def test_a_durable_of_an_earlier_version_is_updated_in_place_not_restored(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """A new version that changes its durable's filter (the reconciler's, D128) takes the durable
    from where it is: nothing counted as drift, nothing handled twice, the filter declared."""
    earlier = ("proxy.*.declared", "proxy.*.health")
    await conn.js.add_consumer(STREAM, spec(DURABLE, filter_subjects=earlier).config())
    handled: Counter[str] = Counter()
    mine = await connect(nats_server.url, credentials=nats_server.credentials_for(DURABLE))
    store = JetStreamEventStore(mine.nc, mine.js)
    effect: Callable[[Delivery], Awaitable[Outcome]] = effect_handler(store)  # type: ignore[assignment]

    async def counted(delivery: Delivery) -> Outcome:
        handled[delivery.recorded.msg_id] += 1
        return await effect(delivery)

    metrics = Metrics()
    declared = spec(DURABLE, check_interval=0.5, earlier_filters=(earlier,))
    loop = ConsumerLoop(mine, declared, counted, store=store, metrics=metrics)
    task = asyncio.create_task(loop.run())
    try:
        await publish_inputs(jetstream_store, FIRST)

        async def all_done() -> bool:
            return all((await effects(jetstream_store, FIRST)).values())

        await until(all_done, timeout=30, what="the inputs handled")
        info = await conn.js.consumer_info(STREAM, DURABLE)
        assert filters(info.config) == {"proxy.*.health"}
        assert info.config.deliver_policy == DeliverPolicy.ALL
        assert RESTORED not in (info.config.metadata or {})
        for kind in ("filter", "vanished", "start"):
            value = metrics.registry.get_sample_value(
                "egress_consumer_drift_total", {"consumer": DURABLE, "kind": kind}
            )
            assert not value, kind
        assert all(handled[f"in-{uid}-0"] == 1 for uid in FIRST), handled
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await mine.close()
