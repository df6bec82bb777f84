"""Deliveries settled inline by the consumer loop, without a task
(services/runtime/nats/consumer.py ``settle``;
docs/decisions/0165-deliveries-settled-inline.md), against a real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from events import subjects
from events.schemas import HealthChanged
from events.store import NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.consumer import ConsumerLoop, Delivery, Outcome
from services.runtime.observability.metrics import Metrics
from tests.support.workload import publish_inputs, spec

pytestmark = pytest.mark.integration


def reason(delivery: Delivery) -> str:
    event = delivery.recorded.event
    assert isinstance(event, HealthChanged)
    return event.reason


def position(delivery: Delivery) -> int:
    return int(reason(delivery).rsplit("-", 1)[-1])


async def run(loop: ConsumerLoop, rounds: int) -> None:
    await loop.ensure()
    for _ in range(rounds):
        await loop.step()
    await loop.drain()


async def test_settled_deliveries_are_acknowledged_without_the_handler(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    uids = [f"s{i}" for i in range(10)]
    await publish_inputs(jetstream_store, uids, per_uid=3)
    settled: list[str] = []
    handled: list[str] = []

    def settle(delivery: Delivery) -> bool:
        settled.append(delivery.recorded.msg_id)
        return True

    async def handle(delivery: Delivery) -> Outcome:
        handled.append(delivery.recorded.msg_id)
        return None

    metrics = Metrics()
    loop = ConsumerLoop(conn, spec(), handle, store=jetstream_store, metrics=metrics, settle=settle)
    await run(loop, 3)

    assert handled == []
    assert sorted(settled) == sorted(f"in-{u}-{i}" for u in uids for i in range(3))
    info = await conn.js.consumer_info("PROXY", "workers")
    assert (info.num_ack_pending, info.num_pending, info.num_redelivered) == (0, 0, 0)
    assert metrics.messages.labels("workers", "ack")._value.get() == 30


async def publish(store: JetStreamEventStore, uids: list[str], positions: range) -> None:
    for uid in uids:
        news = [
            NewEvent(HealthChanged(healthy=True, reason=f"in-{i}"), msg_id=f"in-{uid}-{i}")
            for i in positions
        ]
        await store.append(subjects.proxy(uid), news)


async def test_an_aggregate_s_order_holds_across_both_ways(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """Even positions go to a slow handler, odd ones could be settled at once: each waits for
    its aggregate's message before it, and is settled inline only when nothing of its
    aggregate is in hand (the second fetch's first message)."""
    uids = ["a", "b", "c"]
    order: dict[str, list[int]] = {u: [] for u in uids}
    inline: list[int] = []

    def settle(delivery: Delivery) -> bool:
        if position(delivery) % 2 == 0:
            return False
        inline.append(position(delivery))
        order[subjects.proxy_uid_of(delivery.recorded.subject)].append(position(delivery))
        return True

    async def handle(delivery: Delivery) -> Outcome:
        await asyncio.sleep(0.02)
        order[subjects.proxy_uid_of(delivery.recorded.subject)].append(position(delivery))
        return None

    loop = ConsumerLoop(conn, spec(), handle, store=jetstream_store, settle=settle)
    await publish(jetstream_store, uids, range(0, 3))
    await run(loop, 2)
    assert inline == [], "1 and 2 waited behind 0, their aggregate's handler"
    await publish(jetstream_store, uids, range(3, 6))
    await run(loop, 2)

    assert order == {u: list(range(6)) for u in uids}
    assert inline == [3, 3, 3], "3 of each was settled inline, 5 waited behind 4"
    info = await conn.js.consumer_info("PROXY", "workers")
    assert (info.num_ack_pending, info.num_pending) == (0, 0)


async def test_a_settle_that_fails_leaves_the_delivery_to_the_handler(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await publish_inputs(jetstream_store, ["f"], per_uid=2)
    handled: list[int] = []

    def settle(delivery: Delivery) -> bool:
        raise RuntimeError("cannot tell")

    async def handle(delivery: Delivery) -> Outcome:
        handled.append(position(delivery))
        return None

    loop = ConsumerLoop(conn, spec(), handle, store=jetstream_store, settle=settle)
    await run(loop, 2)

    assert handled == [0, 1]
    info = await conn.js.consumer_info("PROXY", "workers")
    assert (info.num_ack_pending, info.num_pending) == (0, 0)
