"""Claims whose requester was told they failed are withdrawn once the log can be read again."""

from __future__ import annotations

from pathlib import Path

import pytest

from events import subjects
from events.schemas import LeaseAcquired, LeaseReleased
from events.store import NewEvent
from projections.lease import RELEASED
from projections.lease_queries import active, find
from services.discovery.leasing.withdraw import Withdrawals
from services.discovery.views import Views
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer

pytestmark = pytest.mark.integration


def claim(lease_id: str, uid: str = "p1") -> NewEvent:
    event = LeaseAcquired(lease_id=lease_id, proxy_uid=uid, ttl_seconds=600, fencing_token=1)
    return NewEvent(event, f"claim-{lease_id}")


async def views_of(conn: Connection, store: JetStreamEventStore) -> Views:
    views = Views(conn.js, store)
    await views.catch_up()
    return views


async def test_a_stored_granted_claim_is_withdrawn_without_cooldown(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    # The claim reached the log, but its requester heard 503 (the acknowledgement was lost).
    await jetstream_store.append(subjects.lease("p1"), [claim("ghost")], expected_seq=0)
    views = await views_of(conn, jetstream_store)
    try:
        withdrawals = Withdrawals(jetstream_store, views)
        withdrawals.doubt("p1", "ghost", 0)
        assert await withdrawals.settle() == 1
        assert withdrawals.doubts == {}
        view = await views.fresh_lease_view("p1")
        record = find(view, "ghost")
        assert record is not None
        assert record.end == RELEASED
        assert active(view, "ghost", views.now()) is None
        assert view is not None
        assert view.cooldown_until == record.ended_at  # free at once
        history = await jetstream_store.read(subjects.lease("p1"))
        last = history.events[-1].event
        assert isinstance(last, LeaseReleased)
        assert last.withdrawn
    finally:
        await views.close()


async def test_a_claim_that_never_reached_the_log_is_forgotten(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await jetstream_store.append(subjects.lease("p1"), [claim("real")], expected_seq=0)
    views = await views_of(conn, jetstream_store)
    try:
        withdrawals = Withdrawals(jetstream_store, views)
        withdrawals.doubt("p1", "lost", 0)
        assert await withdrawals.settle() == 0
        assert withdrawals.doubts == {}
        view = await views.fresh_lease_view("p1")
        assert active(view, "real", views.now()) is not None  # someone else's lease stays
    finally:
        await views.close()


async def test_a_doubt_waits_while_the_log_is_out_of_reach(
    tmp_path: Path, nats_server: EmbeddedNatsServer, conn: Connection
) -> None:
    store = JetStreamEventStore(conn.nc, conn.js, timeout=0.5, attempts=1)
    await store.append(subjects.lease("p1"), [claim("ghost")], expected_seq=0)
    views = await views_of(conn, store)
    try:
        withdrawals = Withdrawals(store, views)
        withdrawals.doubt("p1", "ghost", 0)
        await nats_server.kill()
        assert await withdrawals.settle() == 0
        assert "ghost" in withdrawals.doubts
    finally:
        await views.close()
