"""The push follower on a real stream: every event once and in order, also when its consumer is
lost, when something else writes to its inbox, when a heartbeat says it missed an event, and
when the nats-server is killed and comes back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from nats.aio.msg import Msg

from events import subjects
from events.schemas import ProxyDeclared, ProxySpec
from events.store import NewEvent
from projections.proxy import ProxyView, apply
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.projector import Projector
from services.runtime.eventlog.push import OrderedPush
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.waiting import until

pytestmark = pytest.mark.integration

HEARTBEAT = 0.2


async def declare(store: JetStreamEventStore, uid: str) -> int:
    event = ProxyDeclared(uid=uid, namespace="ns", name=uid, spec=ProxySpec(provider="local"))
    result = await store.append(subjects.proxy(uid), [NewEvent(event, f"{uid}-declared")])
    return result.last_seq


@contextlib.asynccontextmanager
async def following(
    conn: Connection, after: int = 0
) -> AsyncIterator[tuple[OrderedPush, list[int]]]:
    """A follower of the PROXY stream from ``after``, and the stream sequences it applied."""
    applied: list[int] = []

    def on_msg(msg: Msg) -> None:
        applied.append(msg.metadata.sequence.stream)

    push = OrderedPush(conn.nc, conn.js, "PROXY", "proxy.*.*", on_msg, heartbeat=HEARTBEAT)
    task = asyncio.create_task(push.run(after))
    try:
        await until(lambda: push.inbox != "", what="the first consumer")
        yield push, applied
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_every_event_once_in_order_from_the_start_sequence(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    first = [await declare(jetstream_store, f"p{i}") for i in range(5)]
    async with following(conn, after=first[1]) as (push, applied):
        later = [await declare(jetstream_store, f"q{i}") for i in range(20)]
        await until(lambda: applied[-1:] == later[-1:], what="the last event")
        assert applied == [*first[2:], *later]
        assert push.last_seq == later[-1]
        assert push.restarts == 0


async def test_a_lost_consumer_is_noticed_by_its_silence_and_replaced(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    async with following(conn) as (push, applied):
        before = [await declare(jetstream_store, f"p{i}") for i in range(3)]
        await until(lambda: applied == before)
        for info in await conn.js.consumers_info("PROXY"):
            await conn.js.delete_consumer("PROXY", info.name)
        after = [await declare(jetstream_store, f"q{i}") for i in range(3)]
        await until(lambda: applied == [*before, *after], timeout=10, what="the new consumer")
        assert push.restarts >= 1


async def test_a_stranger_on_the_inbox_changes_nothing_and_a_skipped_sequence_restarts(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    async with following(conn) as (push, applied):
        before = [await declare(jetstream_store, f"p{i}") for i in range(3)]
        await until(lambda: applied == before)
        await conn.nc.publish(push.inbox, b"not from JetStream")  # no reply subject
        await conn.nc.flush()
        short = "$JS.ACK.PROXY.x.1"  # too few tokens to be a delivery
        push._deliver(Msg(conn.nc, subject=push.inbox, reply=short, data=b"{}"))
        assert push.restarts == 0
        assert applied == before
        # A delivery that claims a later consumer sequence: something was missed. Nobody but
        # the server may publish with a JetStream reply subject, so it is handed over directly.
        forged = "$JS.ACK.PROXY.x.1.9999.99.1700000000000000000.0"
        push._deliver(Msg(conn.nc, subject=push.inbox, reply=forged, data=b"{}"))
        await until(lambda: push.restarts == 1, what="a restart after the gap")
        after = [await declare(jetstream_store, f"q{i}") for i in range(3)]
        await until(lambda: applied[-1:] == after[-1:])
        assert applied == [*before, *after]  # the forged message was never applied


async def test_a_heartbeat_naming_an_event_we_missed_restarts_after_the_last_applied(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    async with following(conn) as (push, applied):
        before = [await declare(jetstream_store, f"p{i}") for i in range(2)]
        await until(lambda: applied == before)
        heartbeat = {"Status": "100", "Description": "Idle Heartbeat", "Nats-Last-Consumer": "7"}
        await conn.nc.publish(push.inbox, b"", headers=heartbeat)
        await until(lambda: push.restarts == 1, what="a restart after the heartbeat")
        after = await declare(jetstream_store, "q")
        await until(lambda: applied[-1:] == [after])
        assert applied == [*before, after]


async def test_a_killed_server_that_comes_back_is_followed_again(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    async with following(conn) as (_, applied):
        before = [await declare(jetstream_store, f"p{i}") for i in range(2)]
        await until(lambda: applied == before)
        await nats_server.kill()
        await nats_server.start()
        await until(lambda: conn.nc.is_connected, timeout=20, what="the reconnection")
        after = [await declare(jetstream_store, f"q{i}") for i in range(2)]
        await until(lambda: applied[-2:] == after, timeout=20, what="events after the restart")
        assert applied == [*before, *after]


async def test_a_projector_that_follows_by_push_answers_read_your_writes(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await declare(jetstream_store, "p0")
    projector: Projector[ProxyView] = Projector(conn.js, "PROXY", "proxy.*.*", apply)
    await projector.catch_up()
    task = asyncio.create_task(projector.follow(conn.nc, heartbeat=HEARTBEAT))
    try:
        for i in range(1, 20):
            seq = await declare(jetstream_store, f"p{i}")
            await projector.wait_for(seq, timeout=5)
            assert f"p{i}" in projector.views
        assert projector.last_seq == seq
        rebuilt: Projector[ProxyView] = Projector(conn.js, "PROXY", "proxy.*.*", apply)
        await rebuilt.catch_up()
        await rebuilt.close()
        assert rebuilt.views == projector.views
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await projector.close()
