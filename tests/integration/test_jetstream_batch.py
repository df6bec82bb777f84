"""A decision's events in one atomic batch on a real nats-server
(docs/decisions/0165-a-decision-in-one-atomic-batch.md): one acknowledgement for all of them,
none of them stored when the commit never comes, and streams of earlier versions made to take
batches in place."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from nats.aio.msg import Msg

from events import codec, subjects
from events.errors import StoreUnavailable
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import STREAMS, differences, ensure_streams
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer
from tests.contract.event_store import command, declared, health, status

pytestmark = pytest.mark.integration


def counting_acks(store: JetStreamEventStore) -> list[str]:
    """The subjects of the publishes that wait for an acknowledgement."""
    waited: list[str] = []
    publisher = store._publisher
    real = publisher.js.publish

    async def publish(subject: str, *args: Any, **kwargs: Any) -> Any:
        waited.append(subject)
        return await real(subject, *args, **kwargs)

    publisher.js.publish = publish  # type: ignore[method-assign]
    return waited


async def test_a_decision_of_several_events_waits_for_one_acknowledgement(
    conn: Connection,
) -> None:
    store = JetStreamEventStore(conn.nc, conn.js)
    agg = subjects.proxy("one-ack")
    await store.append(agg, [declared("one-ack")], expected_seq=0)
    waited = counting_acks(store)

    result = await store.append(agg, [command(1), status(1), health(1)], expected_seq=1)

    assert waited == ["proxy.one-ack.health"]  # the commit, the batch's last message
    assert result.seqs == [2, 3, 4]
    history = await store.read(agg)
    assert [r.msg_id for r in history.events] == [
        "one-ack-declared",
        "cmd-1",
        "status-1",
        "health-1",
    ]
    assert [r.seq for r in history.events] == [1, 2, 3, 4]


async def test_a_batch_s_messages_say_what_follows_what(conn: Connection) -> None:
    """What a consumer sees: the batch's first checked against the aggregate, the others
    placed right after it (``codec.expected_last``)."""
    store = JetStreamEventStore(conn.nc, conn.js)
    agg = subjects.proxy("chained")
    await store.append(agg, [declared("chained")], expected_seq=0)
    # Another aggregate's event in between: the batch still lands next to each other.
    await store.append(subjects.proxy("between"), [declared("between")], expected_seq=0)
    seqs = (await store.append(agg, [command(1), status(1)], expected_seq=1)).seqs
    sub = await conn.js.pull_subscribe("proxy.chained.>", durable="chained", stream="PROXY")
    msgs = await sub.fetch(3, timeout=5)
    afters = [
        codec.expected_last(m.headers, agg.filter_subject, m.metadata.sequence.stream) for m in msgs
    ]
    assert [m.metadata.sequence.stream for m in msgs] == [1, *seqs]
    assert seqs == [3, 4]
    assert afters == [0, 1, 3]


async def test_a_batch_whose_commit_never_comes_stores_none_of_it(
    conn: Connection, nats_server: EmbeddedNatsServer
) -> None:
    """The writer dies between its batch's first message and the commit: the first message
    reached the server (a plain subscriber saw it), yet the stream holds none of the batch."""
    store = JetStreamEventStore(conn.nc, conn.js)
    agg = subjects.proxy("cut")
    await store.append(agg, [declared("cut")], expected_seq=0)
    watcher = await connect(nats_server.url)
    seen: list[Msg] = []
    arrived = asyncio.Event()

    async def saw(msg: Msg) -> None:
        seen.append(msg)
        arrived.set()

    await watcher.nc.subscribe("proxy.cut.cmd", cb=saw)
    await watcher.nc.flush()

    async def killed(*args: Any, **kwargs: Any) -> Any:
        await conn.nc.flush()
        await asyncio.wait_for(arrived.wait(), 5)
        await conn.nc.close()  # the connection is gone before the commit left
        raise StoreUnavailable("killed before the commit")

    store._publisher.js.publish = killed  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):
        await store.append(agg, [command(1), status(1)], expected_seq=1)

    assert [m.headers and m.headers.get(codec.HDR_MSG_ID) for m in seen] == ["cmd-1"]
    try:
        reader = JetStreamEventStore(watcher.nc, watcher.js)
        history = await reader.read(agg)
        assert [r.msg_id for r in history.events] == ["cut-declared"]
        # The retry of another process appends the decision whole.
        result = await reader.append(agg, [command(1), status(1)], expected_seq=1)
        assert result.duplicates == 0
        assert [r.msg_id for r in (await reader.read(agg)).events] == [
            "cut-declared",
            "cmd-1",
            "status-1",
        ]
    finally:
        await watcher.close()


async def test_a_retry_after_a_lost_batch_acknowledgement_stores_nothing_twice(
    conn: Connection,
) -> None:
    store = JetStreamEventStore(conn.nc, conn.js)
    agg = subjects.proxy("again")
    await store.append(agg, [declared("again")], expected_seq=0)
    first = await store.append(agg, [command(1), status(1)], expected_seq=1)

    again = await store.append(agg, [command(1), status(1)], expected_seq=1)

    assert again.seqs == first.seqs
    assert again.duplicates == 2
    assert len((await store.read(agg)).events) == 3


async def test_a_stream_of_an_earlier_version_takes_batches_after_start_up(
    conn: Connection,
) -> None:
    """A deployment's stream made before batches: start-up turns them on in place, keeping its
    events; a store that met the stream without them appends one at a time meanwhile."""
    spec = next(s for s in STREAMS if s.name == "PROXY")
    old = replace(spec.config(1), allow_atomic=False)
    await conn.js.update_stream(old)
    store = JetStreamEventStore(conn.nc, conn.js)
    agg = subjects.proxy("old")
    waited = counting_acks(store)
    await store.append(agg, [declared("old"), health(1)], expected_seq=0)
    assert len(waited) == 2, "one publish each on a stream without batches"

    updated: list[str] = []
    assert await ensure_streams(conn.js, 1, updated) == []

    assert updated == ["PROXY"]
    info = await conn.js.stream_info("PROXY")
    assert info.config.allow_atomic is True
    assert differences(info.config, spec.config(1)) == {}
    assert [r.msg_id for r in (await store.read(agg)).events] == ["old-declared", "health-1"]
    fresh = JetStreamEventStore(conn.nc, conn.js)
    waited = counting_acks(fresh)
    await fresh.append(agg, [health(2), health(3)], expected_seq=2)
    assert len(waited) == 1
    again: list[str] = []
    await ensure_streams(conn.js, 1, again)
    assert again == []


async def test_a_stream_that_stops_taking_batches_is_appended_to_one_event_at_a_time(
    conn: Connection,
) -> None:
    store = JetStreamEventStore(conn.nc, conn.js)
    agg = subjects.proxy("turned-off")
    await store.append(agg, [declared("turned-off"), health(1)], expected_seq=0)
    spec = next(s for s in STREAMS if s.name == "PROXY")
    await conn.js.update_stream(replace(spec.config(1), allow_atomic=False))

    result = await store.append(agg, [health(2), health(3)], expected_seq=2)

    assert result.seqs == [3, 4]
    assert store._publisher.atomic["PROXY"] is False
    assert [r.msg_id for r in (await store.read(agg)).events][-2:] == ["health-2", "health-3"]
