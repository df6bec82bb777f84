"""The durable consumer loop against a real nats-server."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from events import subjects
from events.schemas import DeadLettered, HealthChanged
from events.store import NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.consumer import (
    SHORT_FETCH,
    SHORT_FETCHES_AFTER_BIND,
    ConsumerLoop,
    Delivery,
    GiveUp,
    Handler,
    Outcome,
    Retry,
)
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.metrics import Metrics
from tests.support.waiting import until
from tests.support.workload import effect_handler, effects, publish_inputs, spec

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


async def run_steps(loop: ConsumerLoop, rounds: int = 10) -> None:
    for _ in range(rounds):
        await loop.step()
    await loop.drain()


async def deadletters(store: JetStreamEventStore, durable: str) -> list[DeadLettered]:
    history = await store.read(subjects.deadletter(durable))
    return [r.event for r in history.events if isinstance(r.event, DeadLettered)]


async def test_handles_every_message_once_and_acks(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    uids = [f"p{i}" for i in range(20)]
    await publish_inputs(jetstream_store, uids, per_uid=2)
    handler: Handler = effect_handler(jetstream_store)  # type: ignore[assignment]
    metrics = Metrics()
    loop = ConsumerLoop(conn, spec(), handler, store=jetstream_store, metrics=metrics)
    await loop.ensure()
    await run_steps(loop)
    got = await effects(jetstream_store, uids)
    assert all(sorted(v) == [f"in-{u}-0", f"in-{u}-1"] for u, v in got.items())
    info = await conn.js.consumer_info("PROXY", "workers")
    assert info.num_ack_pending == 0
    assert info.num_pending == 0
    assert metrics.messages.labels("workers", "ack")._value.get() == 40


async def test_same_aggregate_in_order_others_concurrently(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await publish_inputs(jetstream_store, ["a", "b"], per_uid=5)
    seen: list[tuple[str, str]] = []
    running: dict[str, int] = {"a": 0, "b": 0}
    overlap_across = False

    async def handle(delivery: Delivery) -> Outcome:
        nonlocal overlap_across
        uid = subjects.proxy_uid_of(delivery.recorded.subject)
        running[uid] += 1
        assert running[uid] == 1, "two messages of one aggregate ran at once"
        if all(running.values()):
            overlap_across = True
        await asyncio.sleep(0.02)
        seen.append((uid, delivery.recorded.msg_id))
        running[uid] -= 1
        return None

    loop = ConsumerLoop(conn, spec(), handle, store=jetstream_store)
    await loop.ensure()
    await run_steps(loop, 3)
    for uid in ("a", "b"):
        assert [m for u, m in seen if u == uid] == [f"in-{uid}-{i}" for i in range(5)]
    assert overlap_across


async def test_poison_message_is_dead_lettered_and_loop_continues(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await conn.js.publish(
        "proxy.bad.health",
        b'{"type":"HealthChanged","healthy":"not-a-bool"}',
        headers={"Egress-Event-Type": "HealthChanged", "Nats-Msg-Id": "poison"},
    )
    await publish_inputs(jetstream_store, ["good"])
    handler: Handler = effect_handler(jetstream_store)  # type: ignore[assignment]
    loop = ConsumerLoop(conn, spec(), handler, store=jetstream_store)
    await loop.ensure()
    await run_steps(loop, 3)
    dead = await deadletters(jetstream_store, "workers")
    assert len(dead) == 1
    assert dead[0].subject == "proxy.bad.health"
    assert "undecodable" in dead[0].reason
    assert "not-a-bool" in dead[0].payload
    assert (await effects(jetstream_store, ["good"]))["good"] == ["in-good-0"]


async def test_an_event_of_a_newer_version_goes_back_then_to_the_dead_letters(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """Acknowledged, it would be lost to every replica of the durable (a rolling upgrade's
    newer replicas included); kept whole, it is replayed once every replica reads it."""
    await conn.js.publish(
        "proxy.new.health",
        b'{"type":"HealthFromTheFuture"}',
        headers={"Egress-Event-Type": "HealthFromTheFuture", "Nats-Msg-Id": "future-1"},
    )
    await conn.js.publish(
        "proxy.newer.health",
        b'{"type":"HealthChanged","healthy":true}',
        headers={"Egress-Event-Type": "HealthChanged", "Egress-Schema": "99"},
    )
    calls: list[str] = []

    async def handle(delivery: Delivery) -> Outcome:
        calls.append(delivery.recorded.msg_id)
        return None

    metrics = Metrics()
    fast = spec(retry_base=0.05, retry_max=0.2)
    loop = ConsumerLoop(conn, fast, handle, store=jetstream_store, metrics=metrics)
    await loop.ensure()

    async def dead() -> bool:
        await run_steps(loop, 1)
        return len(await deadletters(jetstream_store, "workers")) == 2

    await until(dead, timeout=30, what="both dead-lettered after max_deliver rounds")
    assert calls == []
    letters = await deadletters(jetstream_store, "workers")
    # Sent back each round rather than acknowledged: delivered max_deliver times.
    assert [d.deliveries for d in letters] == [fast.max_deliver] * 2
    reasons = sorted(d.reason for d in letters)
    assert all(r.startswith("written by a newer version: ") for r in reasons), reasons
    assert "schema 99" in reasons[0], reasons
    assert "HealthFromTheFuture" in reasons[1], reasons
    assert metrics.messages.labels("workers", "skipped")._value.get() == fast.max_deliver * 2
    assert (await conn.js.consumer_info("PROXY", "workers")).num_ack_pending == 0


async def test_failing_handler_retries_then_dead_letters(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await publish_inputs(jetstream_store, ["flaky", "broken"])
    attempts: dict[str, list[int]] = {"flaky": [], "broken": []}

    async def handle(delivery: Delivery) -> Outcome:
        uid = subjects.proxy_uid_of(delivery.recorded.subject)
        attempts[uid].append(delivery.attempt)
        if uid == "broken" or delivery.attempt < 2:
            raise RuntimeError(f"boom {uid}")
        return None

    loop = ConsumerLoop(conn, spec(max_deliver=3, retry_base=0.05), handle, store=jetstream_store)
    await loop.ensure()

    async def settled() -> bool:
        await run_steps(loop, 1)
        return len(await deadletters(jetstream_store, "workers")) == 1 and attempts["flaky"] == [
            1,
            2,
        ]

    await until(settled)
    assert attempts["broken"] == [1, 2, 3]
    dead = await deadletters(jetstream_store, "workers")
    assert "failed 3 times" in dead[0].reason
    assert "boom broken" in dead[0].reason


async def test_give_up_dead_letters_at_once(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await publish_inputs(jetstream_store, ["hopeless"])

    async def handle(delivery: Delivery) -> Outcome:
        raise GiveUp("cannot ever work")

    loop = ConsumerLoop(conn, spec(), handle, store=jetstream_store)
    await loop.ensure()
    await run_steps(loop, 2)
    dead = await deadletters(jetstream_store, "workers")
    assert [d.reason for d in dead] == ["gave up: cannot ever work"]


async def test_retry_outcome_redelivers_later(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await publish_inputs(jetstream_store, ["later"])
    attempts: list[float] = []

    async def handle(delivery: Delivery) -> Outcome:
        attempts.append(asyncio.get_running_loop().time())
        return Retry(0.3) if len(attempts) == 1 else None

    loop = ConsumerLoop(conn, spec(), handle, store=jetstream_store)
    await loop.ensure()

    async def twice() -> bool:
        await run_steps(loop, 1)
        return len(attempts) == 2

    await until(twice)
    assert attempts[1] - attempts[0] >= 0.25


async def test_replicas_share_the_work(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    uids = [f"r{i}" for i in range(40)]
    await publish_inputs(jetstream_store, uids)
    handled: dict[str, list[str]] = {"one": [], "two": []}

    def handler_for(name: str) -> Handler:
        async def handle(delivery: Delivery) -> Outcome:
            await asyncio.sleep(0.01)
            handled[name].append(delivery.recorded.msg_id)
            return None

        return handle

    second = await connect(conn.nc.connected_url.geturl() if conn.nc.connected_url else "")
    try:
        loops = [
            ConsumerLoop(conn, spec(batch=4), handler_for("one"), store=jetstream_store),
            ConsumerLoop(second, spec(batch=4), handler_for("two"), store=jetstream_store),
        ]
        await loops[0].ensure()

        async def all_handled() -> bool:
            await asyncio.gather(*(run_steps(lp, 1) for lp in loops))
            return len(handled["one"]) + len(handled["two"]) >= len(uids)

        await until(all_handled)
    finally:
        await second.close()
    assert sorted(handled["one"] + handled["two"]) == sorted(f"in-{u}-0" for u in uids)
    assert handled["one"]
    assert handled["two"]


async def test_resumes_after_nats_server_restart(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    handler: Handler = effect_handler(jetstream_store)  # type: ignore[assignment]
    loop = ConsumerLoop(conn, spec(), handler, store=jetstream_store)
    task = asyncio.create_task(loop.run())
    try:
        await publish_inputs(jetstream_store, ["before"])

        async def before_done() -> bool:
            return (await effects(jetstream_store, ["before"]))["before"] == ["in-before-0"]

        await until(before_done)
        await nats_server.stop()
        await until(lambda: not conn.nc.is_connected, what="the client sees the server gone")
        await nats_server.start()
        await until(lambda: _reconnected(conn))
        await publish_inputs(jetstream_store, ["after"])

        async def after_done() -> bool:
            return (await effects(jetstream_store, ["after"]))["after"] == ["in-after-0"]

        await until(after_done, timeout=30)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _reconnected(conn: Connection) -> bool:
    return conn.reconnects >= 1 and conn.nc.is_connected


async def test_killed_mid_batch_loses_nothing_and_repeats_no_effect(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    uids = [f"k{i}" for i in range(30)]
    await publish_inputs(jetstream_store, uids)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    async def worker() -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.consumer_worker",
            nats_server.url,
            "killable",
            "0.5",
            "2",
            stdout=asyncio.subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        assert proc.stdout is not None
        assert (await proc.stdout.readline()).strip() == b"ready"
        return proc

    first = await worker()

    async def some_done() -> bool:
        done = await effects(jetstream_store, uids)
        return sum(bool(v) for v in done.values()) >= 5

    await until(some_done)
    first.send_signal(signal.SIGKILL)
    await first.wait()
    info = await conn.js.consumer_info("PROXY", "killable")
    assert info.num_ack_pending > 0, "the kill should land with work in flight"

    second = await worker()
    try:

        async def all_done() -> bool:
            done = await effects(jetstream_store, uids)
            return all(done.values())

        await until(all_done, timeout=60)
    finally:
        second.send_signal(signal.SIGKILL)
        await second.wait()
    done = await effects(jetstream_store, uids)
    assert done == {u: [f"in-{u}-0"] for u in uids}


async def test_dead_letter_store_failure_keeps_message(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """If the dead-letter append itself fails, the message is not acked (nothing is lost)."""
    await conn.js.publish(
        "proxy.bad2.health", b"{not json", headers={"Egress-Event-Type": "HealthChanged"}
    )

    class Failing:
        async def append(self, *args: object, **kwargs: object) -> object:
            raise OSError("disk on fire")

        async def read(self, *args: object, **kwargs: object) -> object:
            raise OSError("disk on fire")

    async def handle(delivery: Delivery) -> Outcome:
        return None

    loop = ConsumerLoop(conn, spec(retry_max=0.1), handle, store=Failing())  # type: ignore[arg-type]
    await loop.ensure()
    await run_steps(loop, 1)
    info = await conn.js.consumer_info("PROXY", "workers")
    assert info.num_ack_pending + info.num_redelivered + info.num_pending >= 1
    assert info.ack_floor.stream_seq == 0

    real = ConsumerLoop(conn, spec(), handle, store=jetstream_store)

    async def dead_lettered() -> bool:
        await run_steps(real, 1)
        return len(await deadletters(jetstream_store, "workers")) == 1

    await until(dead_lettered)


def _unused(_: HealthChanged, __: NewEvent) -> None:
    """Keeps the schema imports honest for mypy when tests are trimmed."""


async def test_resumes_when_restart_lands_during_a_long_fetch(
    nats_server: EmbeddedNatsServer,
    conn: Connection,
    jetstream_store: JetStreamEventStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pull request pending on the old server is gone; the loop must not wait on it."""
    handler: Handler = effect_handler(jetstream_store)  # type: ignore[assignment]
    loop = ConsumerLoop(conn, spec(fetch_timeout=30.0), handler, store=jetstream_store)
    await loop.ensure()
    long_fetch = asyncio.Event()
    real_fetch = loop._fetch

    async def fetch(n: int) -> list[Msg]:
        # Bound, and past the short fetches that follow a bind: this one waits up to 30 s.
        bound = loop._sub is not None and loop._bound_generation == conn.reconnects
        if bound and loop._short_fetches == 0:
            long_fetch.set()
        return await real_fetch(n)

    monkeypatch.setattr(loop, "_fetch", fetch)

    async def long_fetch_pending() -> bool:
        info = await conn.js.consumer_info(loop.spec.stream, loop.spec.durable)
        return long_fetch.is_set() and (info.num_waiting or 0) >= 1

    task = asyncio.create_task(loop.run())
    try:
        # The restart lands in a 30 s fetch, its pull request waiting on the server.
        timeout = SHORT_FETCH * SHORT_FETCHES_AFTER_BIND + 10
        await until(long_fetch_pending, timeout=timeout, what="a long fetch pending")
        await nats_server.stop()
        await nats_server.start()
        await until(lambda: _reconnected(conn))
        await publish_inputs(jetstream_store, ["during"])

        async def done() -> bool:
            return (await effects(jetstream_store, ["during"]))["during"] == ["in-during-0"]

        await until(done, timeout=15)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_recreates_a_consumer_that_vanished(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    handler: Handler = effect_handler(jetstream_store)  # type: ignore[assignment]
    loop = ConsumerLoop(conn, spec(), handler, store=jetstream_store)
    task = asyncio.create_task(loop.run())
    try:
        await publish_inputs(jetstream_store, ["one"])

        async def first() -> bool:
            return bool((await effects(jetstream_store, ["one"]))["one"])

        await until(first)
        await conn.js.delete_consumer("PROXY", "workers")
        await publish_inputs(jetstream_store, ["two"])

        async def second() -> bool:
            return bool((await effects(jetstream_store, ["two"]))["two"])

        await until(second)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
