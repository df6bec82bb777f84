"""Views restored from snapshots equal views rebuilt from the events alone, on a real nats-server:
after more events, with writers whose passes interleave, and when a snapshot is unusable (then
the whole stream is read). A discovery replica started from snapshots serves what one started
from the events serves."""

from __future__ import annotations

import random
from datetime import timedelta

import httpx
import pytest

from events import subjects
from events.schemas import LeaseAcquired, LeaseReleased, LeaseReported
from events.store import NewEvent
from projections import lease as lease_fold
from projections.lease import LeaseView
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.projector import Projector
from services.runtime.eventlog.snapshots import SnapshotStore, Snapshotter
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

BUCKET = "test-views"


async def leases(store: JetStreamEventStore, uids: list[str], rounds: int, seed: int) -> None:
    """Grants, reports and releases on ``uids``, in a shuffled order."""
    rng = random.Random(seed)
    for n in range(rounds):
        for uid in rng.sample(uids, len(uids)):
            lease_id = f"{uid}-{seed}-{n}"
            events = [
                LeaseAcquired(lease_id=lease_id, proxy_uid=uid, ttl_seconds=600),
                LeaseReported(
                    lease_id=lease_id,
                    proxy_uid=uid,
                    outcome=rng.choice(["success", "blocked", "failed"]),
                    target="shop.example",
                    backoff_seconds=60,
                ),
                LeaseReleased(lease_id=lease_id, proxy_uid=uid),
            ]
            await store.append(
                subjects.lease(uid), [NewEvent(e, f"{lease_id}-{i}") for i, e in enumerate(events)]
            )


def projector(
    conn: Connection, version: int = 1, *, snapshots: bool = True
) -> Projector[LeaseView]:
    store = SnapshotStore(conn.js, BUCKET, "lease", version, LeaseView) if snapshots else None
    return Projector(conn.js, subjects.LEASE_STREAM, "lease.*", lease_fold.apply, snapshots=store)


async def rebuilt(conn: Connection) -> dict[str, LeaseView]:
    """The views from the events alone."""
    full = projector(conn, snapshots=False)
    try:
        await full.catch_up()
        return full.views
    finally:
        await full.close()


async def restored(conn: Connection, version: int = 1) -> Projector[LeaseView]:
    fresh = projector(conn, version)
    await fresh.catch_up()
    await fresh.close()
    return fresh


async def test_restored_views_equal_the_views_from_the_events(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    uids = [f"p{n}" for n in range(12)]
    await leases(jetstream_store, uids, rounds=3, seed=1)
    writer = projector(conn)
    await writer.catch_up()
    assert writer.snapshots is not None
    snapshotter = Snapshotter(writer, writer.snapshots)
    assert await snapshotter.write_once() == 12  # the first pass takes them all
    await leases(jetstream_store, uids[:4], rounds=2, seed=2)
    await writer.catch_up()
    assert await snapshotter.write_once() == 4  # then only what changed
    await leases(jetstream_store, uids[:2], rounds=1, seed=3)  # after the last pass
    await writer.close()

    fresh = await restored(conn)
    assert fresh.restored_views == 12
    assert fresh.applied == 2 * 3  # only the events after the last pass were read
    assert fresh.views == await rebuilt(conn)


async def test_interleaved_writers_never_lose_an_event(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """A slow writer's pass of older views lands after a newer one: still exact."""
    uids = ["a", "b", "c"]
    await leases(jetstream_store, uids, rounds=1, seed=4)
    slow = projector(conn)
    await slow.catch_up()
    old_views, old_seq = dict(slow.views), slow.last_seq
    await leases(jetstream_store, uids, rounds=1, seed=5)
    fast = projector(conn)
    await fast.catch_up()
    assert fast.snapshots is not None
    assert slow.snapshots is not None
    await Snapshotter(fast, fast.snapshots).write_once()
    await slow.snapshots.write(old_views.items(), old_seq)  # the late pass
    # The fast writer's next pass finds nothing changed: only its pass key moves on, and the
    # late pass's views stay, older than it.
    await Snapshotter(fast, fast.snapshots, refresh_every=2, passes=1).write_once()
    await leases(jetstream_store, ["a"], rounds=1, seed=6)
    await slow.close()
    await fast.close()
    assert (await restored(conn)).views == await rebuilt(conn)


async def test_an_unusable_snapshot_means_the_whole_stream_is_read(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await leases(jetstream_store, ["a", "b"], rounds=2, seed=7)
    writer = projector(conn)
    await writer.catch_up()
    assert writer.snapshots is not None
    await Snapshotter(writer, writer.snapshots).write_once()
    await writer.close()
    kv = await writer.snapshots.open()
    await kv.put("lease.v1.view.a", b"\xc1 not msgpack")
    fresh = await restored(conn)
    assert fresh.restored_views == 0
    assert fresh.snapshots is not None
    assert fresh.snapshots.unusable == 1
    assert fresh.views == await rebuilt(conn)
    # A pass beyond the stream's end: the stream was recreated, the snapshots are of another.
    await Snapshotter(writer, writer.snapshots).write_once()
    await writer.snapshots.write([], 10**9)
    again = await restored(conn)
    assert again.restored_views == 0
    assert again.views == await rebuilt(conn)


async def test_another_fold_version_ignores_the_snapshots(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await leases(jetstream_store, ["a"], rounds=2, seed=8)
    writer = projector(conn)
    await writer.catch_up()
    assert writer.snapshots is not None
    await Snapshotter(writer, writer.snapshots).write_once()
    await writer.close()
    other = await restored(conn, version=2)
    assert other.restored_views == 0
    assert other.views == await rebuilt(conn)


async def test_a_replica_started_from_snapshots_serves_the_same(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    for uid in ("p1", "p2", "p3"):
        await ready_proxy(jetstream_store, uid, {"pool": "s"})
    async with (
        discovery(nats_server.url, snapshot_interval=0.1) as (first, base),
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        held = (await client.post("/v1/leases", json={"ttlSeconds": 600})).json()
        blocked = (await client.post("/v1/leases", json={"ttlSeconds": 600})).json()
        said = await client.post(
            f"/v1/leases/{blocked['id']}/report",
            json={"outcome": "blocked", "target": "shop.example"},
        )
        assert said.status_code == 204
        assert first.api is not None
        views = first.api.views
        store = views.leases.snapshots
        assert store is not None

        async def covered() -> bool:
            done = await store.restore(views.leases.last_seq)
            return done is not None and done.start > views.leases.last_seq

        await until(covered, timeout=30, what="a pass that includes the report")
        before = (await client.get("/v1/proxies")).json()
    async with (
        discovery(nats_server.url, snapshot_interval=0) as (second, base),
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        assert second.api is not None
        assert second.api.views.leases.restored_views == 2
        assert second.api.views.proxies.restored_views == 3
        after = (await client.get("/v1/proxies")).json()
        assert after == before
        shown = await client.get(f"/v1/leases/{held['id']}")
        assert shown.status_code == 200, shown.text
        assert shown.json()["fencingToken"] == held["fencingToken"]
        busy = await client.post(
            "/v1/leases", json={"target": "shop.example", "proxyUid": blocked["proxy"]["uid"]}
        )
        assert busy.status_code == 503
        assert timedelta(seconds=int(busy.headers["Retry-After"])) > timedelta(minutes=9)
