"""The GC service sweeps leftovers against a real nats-server: events with their kind, metrics,
provider spans through the instrumented wrapper the service builds, and a dry run that appends
and deletes nothing. (The kvm provider's real leftovers: test_kvm_gc.py.)"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from events import subjects
from events.schemas import (
    Event,
    OrphanDeleted,
    OrphanFound,
    ProxyDeclared,
    ProxySpec,
    SweepCompleted,
)
from events.store import NewEvent, derive_msg_id
from services.gc.collector import GarbageCollector
from services.gc.lock import SweepLock
from services.gc.service import GcService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.metrics import Metrics
from services.runtime.service import ServiceContext
from services.runtime.settings.shared import Settings
from services.testing.provider import FakeProviderWithLeftovers
from tests.support.waiting import until

pytestmark = pytest.mark.integration

HOUR_AGO = datetime.now(UTC) - timedelta(hours=1)
GONE = "hosts/hv1/volumes/default/px-gone-0123abcd.qcow2"
KEPT = "hosts/hv1/volumes/default/px-live-0123abcd.qcow2"


async def gc_events(store: JetStreamEventStore, provider: str) -> list[Event]:
    return list((await store.read(subjects.gc(provider))).decoded())


def seeded() -> FakeProviderWithLeftovers:
    fake = FakeProviderWithLeftovers("fake")
    fake.leave(GONE, "gone", HOUR_AGO)
    fake.leave(KEPT, "live", HOUR_AGO)
    return fake


async def declare_live(store: JetStreamEventStore) -> None:
    event = ProxyDeclared(uid="live", namespace="ns", name="live", spec=ProxySpec())
    await store.append(subjects.proxy("live"), [NewEvent(event, derive_msg_id("test", "live"))])


async def test_service_sweeps_leftovers_with_events_and_metrics(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = seeded()
    await declare_live(jetstream_store)
    metrics = Metrics()
    ctx = ServiceContext(Settings(nats_url=nats_server.url), conn, jetstream_store, metrics)
    service = GcService(None, Path("."), interval=0.2, grace=60.0, providers={"fake": fake})
    task = asyncio.create_task(service.run(ctx))
    try:

        async def collected() -> bool:
            return GONE not in fake.left

        await until(collected, timeout=10.0)

        async def recorded() -> bool:
            return any(
                isinstance(e, SweepCompleted) for e in await gc_events(jetstream_store, "fake")
            )

        await until(recorded, timeout=10.0)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert KEPT in fake.left

    events = await gc_events(jetstream_store, "fake")
    (found,) = [e for e in events if isinstance(e, OrphanFound)]
    (deleted,) = [e for e in events if isinstance(e, OrphanDeleted)]
    assert (found.provider_id, found.kind, found.owner_uid) == (GONE, "volume", "gone")
    assert (deleted.provider_id, deleted.kind, deleted.ok) == (GONE, "volume", True)
    first = next(e for e in events if isinstance(e, SweepCompleted))
    assert (first.leftovers, first.leftovers_deleted, first.leftovers_reason) == (1, 1, "")
    assert (first.orphans, first.deleted) == (0, 0)
    assert found.sweep_id == deleted.sweep_id == first.sweep_id

    text = metrics.render().decode()
    assert 'egress_gc_leftovers_found_total{kind="volume",provider="fake"} 1.0' in text
    ok = 'egress_gc_leftover_deletes_total{kind="volume",provider="fake",result="ok"} 1.0'
    assert ok in text
    requests = 'egress_provider_requests_total{op="delete_leftover",provider="fake",result="ok"}'
    assert f"{requests} 1.0" in text


async def test_dry_run_reports_leftovers_and_changes_nothing(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = seeded()
    await declare_live(jetstream_store)
    gcol = GarbageCollector(
        conn.js,
        jetstream_store,
        {"fake": fake},
        grace=60.0,
        lock=SweepLock(conn.js, ttl=30.0),
        registry=Metrics().registry,
    )
    try:
        report = await gcol.run_once(dry_run=True)
    finally:
        await gcol.close()
    assert report is not None
    left = report.providers[0].leftovers
    assert left is not None
    assert [lo.provider_id for lo in left.orphans] == [GONE]
    assert left.deleted == []
    assert set(fake.left) == {GONE, KEPT}
    assert await gc_events(jetstream_store, "fake") == []
