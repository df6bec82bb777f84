"""Time travel from checkpoints gives exactly the views a replay from the first event gives, at
any instant (before the first checkpoint, exactly at one, between two, after the last), and
whatever is in the bucket: garbage there only sends the reader back to the replay.

Real nats-server, real streams filled with the product's events (``bench.scale_fleet``), the
writer the discovery service runs, with a small ``every`` so a few thousand events make many
checkpoints.
"""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest

from bench.scale_startup import fill_startup
from events import subjects
from services.runtime.eventlog.asof import ByProxy, read_until
from services.runtime.eventlog.checkpoint_writer import CheckpointWriter
from services.runtime.eventlog.checkpoints import (
    LEASE,
    POOL,
    PROXY,
    CheckpointStore,
    Travel,
    Travelled,
    fold_at,
    stream_bounds,
)
from services.runtime.eventlog.pure import checkpoint as cp
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer

pytestmark = pytest.mark.integration

EVERY = 200


async def replay(conn: Connection, travel: Travel[Any], at: datetime) -> dict[str, Any]:
    views = ByProxy(travel.apply, travel.stream)
    await read_until(conn.js, travel.stream, travel.filter_subject, at, each=views.fold)
    return views.views


async def timestamps(conn: Connection, stream: str) -> list[datetime]:
    """Every event's server timestamp, by sequence (index 0: sequence 1)."""
    seen: list[datetime] = []

    def keep(stored: Any) -> None:
        seen.append(stored.recorded.timestamp)

    await read_until(conn.js, stream, ">", None, each=keep)
    return seen


async def written(
    conn: Connection, travel: Travel[Any], every: int = EVERY
) -> CheckpointWriter[Any]:
    writer: CheckpointWriter[Any] = CheckpointWriter(conn.js, travel, every=every)
    last = (await stream_bounds(conn.js, travel.stream)).last
    await asyncio.wait_for(writer.follow(until_seq=last), 60)
    return writer


async def test_at_random_instants_checkpoints_give_the_replays_views(conn: Connection) -> None:
    await fill_startup(conn, 40, 3000, seed=7)
    lease_writer = await written(conn, LEASE)
    proxy_writer = await written(conn, PROXY, every=50)
    assert lease_writer.stats.written == 3000 // EVERY
    assert proxy_writer.stats.written == 40 * 7 // 50
    rng = random.Random(31)
    cases: tuple[tuple[Travel[Any], int], ...] = ((LEASE, EVERY), (PROXY, 50))
    for travel, every in cases:
        stamps = await timestamps(conn, travel.stream)
        picks = [
            stamps[0] - timedelta(seconds=1),  # before anything
            stamps[every // 2],  # before the first checkpoint
            stamps[every - 1],  # exactly at the first boundary
            stamps[3 * every - 1],  # exactly at another
            stamps[-1] + timedelta(seconds=1),  # after everything
            *(stamps[rng.randrange(len(stamps))] for _ in range(6)),
            *(
                stamps[rng.randrange(len(stamps))] + timedelta(microseconds=rng.randrange(1, 900))
                for _ in range(4)
            ),
        ]
        used = set()
        for at in picks:
            got: Travelled[Any] = await fold_at(conn.js, travel, at)
            assert got.views == await replay(conn, travel, at), (travel.stream, at)
            used.add(got.checkpoint)
        assert len(used) > 3, "the instants should fold from several checkpoints and none"
        assert 0 in used


async def test_checkpoints_of_many_chunks_are_stored_and_read_whole(
    conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small chunks stand in for 10,000 proxies' views: every full chunk, with the headers of
    its ``create``, must fit the bucket's limit, and a reader joins them in order."""
    monkeypatch.setattr(cp, "CHUNK", 2048)
    await fill_startup(conn, 30, 1000, seed=9)
    writer = await written(conn, LEASE)
    assert writer.stats.written == 1000 // EVERY
    assert writer.stats.bytes > 4 * cp.CHUNK * writer.stats.written
    at = (await timestamps(conn, subjects.LEASE_STREAM))[-1]
    got = await fold_at(conn.js, LEASE, at)
    assert got.checkpoint == 1000
    assert got.views == await replay(conn, LEASE, at)


async def test_a_checkpoint_is_folded_from_and_only_later_events_are_read(conn: Connection) -> None:
    await fill_startup(conn, 10, 1000, seed=3)
    await written(conn, LEASE)
    stamps = await timestamps(conn, subjects.LEASE_STREAM)
    got = await fold_at(conn.js, LEASE, stamps[449])
    assert got.checkpoint == 400
    assert got.read == 51  # events 401..450, and 451, which ended the read
    assert got.origin == 1


async def garbage(conn: Connection, travel: Travel[Any], key: str, value: bytes) -> None:
    kv = await CheckpointStore(conn.js, travel).open(create=True)
    assert kv is not None
    await kv.put(key, value)


def head_at(seq: int, **changes: Any) -> bytes:
    base = cp.Head(
        format=cp.FORMAT,
        stream="LEASE",
        tag=LEASE.tag,
        seq=seq,
        subject="lease.x",
        time_us=0,
        high_us=0,
        origin=1,
        views=1,
        raw=10,
        packed=10,
        chunks=1,
        digest="0" * 64,
    )
    return cp.encode_head(msgspec.structs.replace(base, **changes))


@pytest.mark.parametrize(
    "case",
    ["undecodable", "huge", "wrong label", "beyond the stream", "wrong event", "bad chunk"],
)
async def test_garbage_in_the_bucket_falls_back_to_the_replay(conn: Connection, case: str) -> None:
    await fill_startup(conn, 10, 1000, seed=5)
    stamps = await timestamps(conn, subjects.LEASE_STREAM)
    at = stamps[-1]
    tag = LEASE.tag
    # The newest key a reader would pick: every one is garbage of some kind.
    if case == "undecodable":
        await garbage(conn, LEASE, cp.head_key(tag, 800), b"\xc1not msgpack")
    elif case == "huge":
        await garbage(conn, LEASE, cp.head_key(tag, 800), head_at(800, raw=cp.MAX_RAW + 1))
    elif case == "wrong label":
        await garbage(conn, LEASE, cp.head_key(tag, 800), head_at(600, stream="PROXY"))
    elif case == "beyond the stream":
        await garbage(conn, LEASE, cp.head_key(tag, 5000), head_at(5000))
    elif case == "wrong event":
        await garbage(conn, LEASE, cp.head_key(tag, 800), head_at(800))
    else:
        await written(conn, LEASE)
        kv = await CheckpointStore(conn.js, LEASE).open(create=False)
        assert kv is not None
        keys = [k for k in await kv.keys() if k.startswith(f"c.{tag}.{1000:012d}.")]
        assert keys
        await kv.put(keys[0], b"\x00" * 100)
    got = await fold_at(conn.js, LEASE, at)
    assert got.views == await replay(conn, LEASE, at)
    if case == "bad chunk":
        assert got.checkpoint == 800  # the next older one
    else:
        assert got.checkpoint == 0
    # A writer that meets it resumes past it, or from the first event, and still writes.
    writer = await written(conn, LEASE)
    assert writer.stats.last == 1000


async def test_two_writers_at_once_store_one_checkpoint_each_boundary(conn: Connection) -> None:
    await fill_startup(conn, 20, 2000, seed=11)
    last = (await stream_bounds(conn.js, subjects.LEASE_STREAM)).last
    one: CheckpointWriter[Any] = CheckpointWriter(conn.js, LEASE, every=EVERY)
    two: CheckpointWriter[Any] = CheckpointWriter(conn.js, LEASE, every=EVERY)
    await asyncio.wait_for(
        asyncio.gather(one.follow(until_seq=last), two.follow(until_seq=last)), 60
    )
    boundaries = last // EVERY
    assert one.stats.written + two.stats.written == boundaries
    assert one.stats.written + one.stats.skipped == boundaries
    assert two.stats.written + two.stats.skipped == boundaries
    stamps = await timestamps(conn, subjects.LEASE_STREAM)
    for seq in range(EVERY, last + 1, EVERY):
        got = await fold_at(conn.js, LEASE, stamps[seq - 1])
        assert got.checkpoint == seq
        assert got.views == await replay(conn, LEASE, stamps[seq - 1])


async def test_pools_travel_the_same_way(conn: Connection) -> None:
    """No pool in the log: the fold of an empty stream is empty, with or without a writer."""
    await fill_startup(conn, 5, 100, seed=1)
    await written(conn, POOL)
    got = await fold_at(conn.js, POOL, datetime.now().astimezone())
    assert got.views == {}


async def test_discovery_writes_them_and_the_reader_travels_with_them(
    nats_server: EmbeddedNatsServer, conn: Connection
) -> None:
    """With the users the bundled configurations grant (services.runtime.nats.users)."""
    await fill_startup(conn, 10, 1000, seed=2)
    discovery = await connect(nats_server.url, credentials=nats_server.credentials_for("discovery"))
    reader = await connect(nats_server.url, credentials=nats_server.credentials_for("reader"))
    try:
        writer = await written(discovery, LEASE)
        assert writer.stats.written == 1000 // EVERY
        at = (await timestamps(conn, subjects.LEASE_STREAM))[-1]
        got = await fold_at(reader.js, LEASE, at)
        assert got.checkpoint == 1000
        assert got.views == await replay(conn, LEASE, at)
    finally:
        await discovery.close()
        await reader.close()
