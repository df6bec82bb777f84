"""Time travel from checkpoints gives exactly the views a replay from the first event gives, at
any instant (before the first checkpoint, exactly at one, between two, after the last), and
whatever is in the bucket: garbage there only sends the reader back to the replay.

Real nats-server, real streams filled with the product's events (``bench.scale_fleet``), the
writer the discovery service runs, with a small ``every`` so a few thousand events make many
checkpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest
from nats.js.errors import KeyNotFoundError

from bench.scale_fleet import Publisher, lease_pair, proxy_uid
from bench.scale_startup import fill_startup
from events import subjects
from services.runtime.eventlog.asof import ByProxy, read_until
from services.runtime.eventlog.checkpoint_writer import CheckpointWriter
from services.runtime.eventlog.checkpoints import (
    LEASE,
    POOL,
    PROXY,
    UNUSABLE,
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


async def chain_heads(conn: Connection, travel: Travel[Any]) -> dict[int, cp.Head]:
    store = CheckpointStore(conn.js, travel)
    return {h.seq: h for h in await store.heads(await stream_bounds(conn.js, travel.stream))}


async def test_instants_around_a_full_checkpoint_give_the_replays_views(
    conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Just before a full one (the deltas of the previous chain), at it, and just after it. 40
    proxies change mostly all between two checkpoints: a higher share makes chains of them."""
    monkeypatch.setattr(cp, "FULL_RATIO", 2.0)
    await fill_startup(conn, 40, 4000, seed=13)
    writer = await written(conn, LEASE)
    heads = await chain_heads(conn, LEASE)
    fulls = sorted(seq for seq, h in heads.items() if h.full)
    assert writer.stats.fulls == len(fulls) >= 2, "the chain should start again at least once"
    assert len(heads) - len(fulls) > len(fulls), "most checkpoints should be deltas"
    assert all(h.depth > 0 for h in heads.values() if not h.full)
    stamps = await timestamps(conn, subjects.LEASE_STREAM)
    after_deltas = [s for s in fulls[1:] if s < len(stamps) and not heads[s - EVERY].full]
    assert after_deltas, "a chain of deltas should end in a new full one"
    for full in after_deltas:
        for seq, expected in ((full - 1, full - EVERY), (full, full), (full + 1, full)):
            got = await fold_at(conn.js, LEASE, stamps[seq - 1])
            assert got.checkpoint == expected
            assert got.fallbacks == 0
            assert got.views == await replay(conn, LEASE, stamps[seq - 1]), seq
        before = heads[full - EVERY]
        got = await fold_at(conn.js, LEASE, stamps[full - 2])
        assert got.deltas == before.depth


@pytest.mark.parametrize("damage", ["chunk", "chunk gone", "head gone", "base digest"])
async def test_a_damaged_delta_folds_from_the_point_before(
    conn: Connection, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cp, "FULL_RATIO", 2.0)  # chains of a few deltas (see above)
    await fill_startup(conn, 40, 4000, seed=17)
    await written(conn, LEASE)
    heads = await chain_heads(conn, LEASE)
    # A delta with a full one before it and deltas of the same chain after it.
    broken = next(
        h for seq, h in sorted(heads.items()) if h.depth == 2 and not heads[seq + EVERY].full
    )
    later = broken.seq + EVERY
    kv = await CheckpointStore(conn.js, LEASE).open(create=False)
    assert kv is not None
    if damage == "chunk":
        await kv.put(cp.chunk_key(broken.tag, broken.seq, broken.digest, 0), b"\x00" * 100)
    elif damage == "chunk gone":
        await kv.delete(cp.chunk_key(broken.tag, broken.seq, broken.digest, 0))
    elif damage == "head gone":
        await kv.delete(cp.head_key(broken.tag, broken.seq))
    else:
        forged = msgspec.structs.replace(broken, base_digest="f" * 64)
        await kv.put(cp.head_key(broken.tag, broken.seq), cp.encode_head(forged))
    stamps = await timestamps(conn, subjects.LEASE_STREAM)
    before = UNUSABLE[subjects.LEASE_STREAM]
    at = stamps[later + 10 - 1]
    got = await fold_at(conn.js, LEASE, at)
    assert got.checkpoint == broken.base_seq
    assert got.fallbacks >= 1
    assert UNUSABLE[subjects.LEASE_STREAM] > before
    assert got.views == await replay(conn, LEASE, at)
    # A writer that meets it resumes past it (a later full one) or before it, and writes on.
    writer = await written(conn, LEASE)
    assert writer.stats.last == 4000
    got = await fold_at(conn.js, LEASE, stamps[-1])
    assert got.checkpoint == 4000
    assert got.views == await replay(conn, LEASE, stamps[-1])


def every_field(_packer: object, views: dict[str, Any]) -> bytes:
    """How the writers of D163 encoded a full checkpoint: every field, defaults too."""
    return msgspec.msgpack.encode(dict(sorted(views.items())))


async def test_a_bucket_written_before_defaults_were_left_out_is_read_and_continued(
    conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment upgraded in place: its full checkpoints hold every field (D163). The reader
    folds from them, and the new writer resumes their chains with deltas and full ones of its
    own, each travel equal to the replay and none a fallback."""
    monkeypatch.setattr(cp, "FULL_RATIO", 2.0)  # chains of a few deltas (see above)
    await fill_startup(conn, 40, 4000, seed=23)
    with monkeypatch.context() as patched:
        patched.setattr(cp.Packer, "encode", every_field)
        await written(conn, LEASE)
    store = CheckpointStore(conn.js, LEASE)
    heads = await chain_heads(conn, LEASE)
    for head in (h for h in heads.values() if h.full):
        assert b"rotation_id" in cp.inflate(head, await store.payload(head))
    # The upgrade: the old writer stopped at a full one that its next delta followed.
    resume = min(
        seq for seq, h in heads.items() if h.full and seq <= 3000 and not heads[seq + EVERY].full
    )
    kv = await store.open(create=False)
    assert kv is not None
    for seq in range(resume + EVERY, 4001, EVERY):
        await kv.delete(cp.head_key(LEASE.tag, seq))
    writer = await written(conn, LEASE)
    assert writer.stats.resumed_from == resume
    assert writer.stats.unusable == 0
    heads = await chain_heads(conn, LEASE)
    following = heads[resume + EVERY]
    assert not following.full
    assert following.base_seq == resume
    new_fulls = [h for h in heads.values() if h.full and h.seq > resume]
    assert new_fulls, "the new writer should start a chain of its own too"
    for head in new_fulls:
        assert b"rotation_id" not in cp.inflate(head, await store.payload(head))
    stamps = await timestamps(conn, subjects.LEASE_STREAM)
    picks = {resume, following.seq, *(h.seq for h in new_fulls), 4000}
    for seq in sorted(picks):
        got = await fold_at(conn.js, LEASE, stamps[seq - 1])
        assert got.checkpoint == seq
        assert got.fallbacks == 0
        assert got.views == await replay(conn, LEASE, stamps[seq - 1]), seq


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


WRITER = """
import asyncio, sys
from services.runtime.eventlog.checkpoint_writer import CheckpointWriter
from services.runtime.eventlog.checkpoints import LEASE
from services.runtime.nats.connection import connect

async def main() -> None:
    conn = await connect(sys.argv[1])
    await CheckpointWriter(conn.js, LEASE, every=int(sys.argv[2]), lock_ttl=2.0).run()

asyncio.run(main())
"""


async def more_leases(conn: Connection, proxies: int, pairs: int) -> None:
    publisher = Publisher(conn.js)
    for n in range(pairs):
        uid = proxy_uid(n % proxies)
        for event, msg_id in lease_pair(uid, 10_000 + n):
            await publisher.publish(subjects.lease(uid).subject_for(event), event, msg_id)
    await publisher.done()


async def head_written(conn: Connection, seq: int, timeout: float = 30.0) -> None:
    kv = await CheckpointStore(conn.js, LEASE).open(create=True)
    assert kv is not None
    async with asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(KeyNotFoundError):
                await kv.get(cp.head_key(LEASE.tag, seq))
                return
            await asyncio.sleep(0.1)


async def test_one_writer_holds_the_lock_and_another_takes_over_when_it_is_killed(
    nats_server: EmbeddedNatsServer, conn: Connection
) -> None:
    """A writer in another process holds the lock; the one here waits, writes nothing, and once
    the other is killed (no release: its key must expire) it resumes from the other's chain and
    writes what comes next, which a reader folds to the replay's views."""
    await fill_startup(conn, 20, 1000, seed=11)
    child = subprocess.Popen(  # noqa: ASYNC220 - a child to kill -9, not one to await
        [sys.executable, "-c", WRITER, nats_server.url_for("discovery"), str(EVERY)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    here: CheckpointWriter[Any] = CheckpointWriter(conn.js, LEASE, every=EVERY, lock_ttl=2.0)
    task: asyncio.Task[None] | None = None
    try:
        await head_written(conn, 1000)
        task = asyncio.create_task(here.run())
        await asyncio.sleep(3.0)  # more than the TTL: the child refreshes its lock meanwhile
        assert here.stats.waits >= 2
        assert here.stats.written == 0
        child.kill()
        child.wait()
        await more_leases(conn, 20, 500)
        last = (await stream_bounds(conn.js, subjects.LEASE_STREAM)).last
        assert last == 2000
        await head_written(conn, last)
        assert here.stats.resumed_from == 1000  # from the chain the killed writer left
        assert here.stats.written == (last - 1000) // EVERY
    finally:
        child.kill()
        child.wait()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    stamps = await timestamps(conn, subjects.LEASE_STREAM)
    for seq in (1000, 1400, 2000):
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
