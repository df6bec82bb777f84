"""Orphan GC against a real nats-server: the fake provider for the decision's edges, the local
provider (real proxy processes) for a real delete, the lock between replicas, and the CLI."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from events import subjects
from events.schemas import (
    Event,
    InstanceState,
    OrphanDeleted,
    OrphanFound,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyRemoved,
    ProxySpec,
    SweepCompleted,
)
from events.store import NewEvent, derive_msg_id
from services.cli.admin.gc_cmd import gc
from services.cli.common import CliState
from services.gc.collector import GarbageCollector
from services.gc.lock import SweepLock
from services.gc.service import GcService
from services.providers.base import (
    CreateRequest,
    NotFound,
    Permanent,
    Provider,
    Transient,
)
from services.providers.local import LocalProvider
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.logs import configure_logging
from services.runtime.observability.metrics import Metrics
from services.runtime.service import ServiceContext
from services.runtime.settings.shared import Settings
from services.testing.provider import FakeProvider
from tests.contract.provider import delete_all
from tests.support.waiting import until

pytestmark = pytest.mark.integration

HOUR_AGO = datetime.now(UTC) - timedelta(hours=1)


async def declare(store: JetStreamEventStore, uid: str, *more: Event) -> None:
    events = [ProxyDeclared(uid=uid, namespace="ns", name=uid, spec=ProxySpec()), *more]
    await store.append(
        subjects.proxy(uid),
        [NewEvent(e, derive_msg_id("test", uid, str(i))) for i, e in enumerate(events)],
    )


async def made(provider: FakeProvider, owner: str, *, old: bool = True) -> str:
    """An instance owned by ``owner``, created an hour ago unless ``old`` is False."""
    request = CreateRequest(
        name=f"i-{owner}", owner_uid=owner, namespace="ns", proxy_name=owner, spec=ProxySpec()
    )
    pid = await provider.create(request)
    if old:
        provider.instances[pid] = dataclasses.replace(provider.instances[pid], created_at=HOUR_AGO)
    return pid


def collector(
    conn: Connection, store: JetStreamEventStore, providers: Mapping[str, Provider]
) -> GarbageCollector:
    """A replica of its own: its own lock holder id, its own projection."""
    lock = SweepLock(conn.js, ttl=30.0)
    return GarbageCollector(
        conn.js, store, providers, grace=60.0, lock=lock, registry=Metrics().registry
    )


async def gc_events(store: JetStreamEventStore, provider: str) -> list[Event]:
    return list((await store.read(subjects.gc(provider))).decoded())


async def test_deletes_orphans_spares_live_young_and_deleting(
    conn: Connection, jetstream_store: JetStreamEventStore, spans: InMemorySpanExporter
) -> None:
    fake = FakeProvider("fake")
    await declare(jetstream_store, "live")
    await declare(jetstream_store, "deleting", ProxyDeletionRequested(uid="deleting"))
    await declare(jetstream_store, "removed", ProxyRemoved(uid="removed"))
    live, deleting = await made(fake, "live"), await made(fake, "deleting")
    removed, never = await made(fake, "removed"), await made(fake, "never-declared")
    young = await made(fake, "in-flight", old=False)
    gcol = collector(conn, jetstream_store, {"fake": fake})
    try:
        report = await gcol.run_once()
    finally:
        await gcol.close()
    assert report is not None
    assert set(fake.instances) == {live, deleting, young}
    assert sorted(report.providers[0].deleted) == sorted([removed, never])
    assert report.providers[0].young == 1

    events = await gc_events(jetstream_store, "fake")
    found = [e for e in events if isinstance(e, OrphanFound)]
    deleted = [e for e in events if isinstance(e, OrphanDeleted)]
    (summary,) = [e for e in events if isinstance(e, SweepCompleted)]
    assert sorted(e.provider_id for e in found) == sorted([removed, never])
    assert all(e.ok for e in deleted)
    assert len(deleted) == 2
    assert (summary.listed, summary.orphans, summary.deleted, summary.young) == (5, 2, 2, 1)
    assert not summary.skipped
    assert summary.sweep_id
    assert {e.sweep_id for e in found} | {e.sweep_id for e in deleted} == {summary.sweep_id}

    (span,) = [s for s in spans.get_finished_spans() if s.name == "gc.sweep"]
    assert span.attributes is not None
    assert (span.attributes["gc.providers"], span.attributes["gc.deleted"]) == (1, 2)
    deletes = [s for s in spans.get_finished_spans() if s.name == "provider.delete"]
    assert deletes == []  # the collector takes providers as given; the service instruments


async def test_deleting_proxy_is_spared_until_removed(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider("fake")
    await declare(jetstream_store, "p1", ProxyDeletionRequested(uid="p1"))
    pid = await made(fake, "p1")
    gcol = collector(conn, jetstream_store, {"fake": fake})
    try:
        assert (await gcol.run_once()) is not None
        assert pid in fake.instances
        await jetstream_store.append(
            subjects.proxy("p1"), [NewEvent(ProxyRemoved(uid="p1"), "removed-p1")]
        )
        report = await gcol.run_once()  # the same projector, caught up incrementally
    finally:
        await gcol.close()
    assert report is not None
    assert report.providers[0].deleted == [pid]
    assert pid not in fake.instances


async def test_failed_listing_spares_that_provider_and_failed_delete_spares_nothing_else(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    broken, flaky = FakeProvider("broken"), FakeProvider("flaky")
    kept = await made(broken, "gone-1")
    broken.inject("list", Transient("listing timed out"))
    first, second = await made(flaky, "gone-2"), await made(flaky, "gone-3")
    flaky.inject("delete", Permanent("forbidden"))
    gcol = collector(conn, jetstream_store, {"broken": broken, "flaky": flaky})
    try:
        report = await gcol.run_once()
    finally:
        await gcol.close()
    assert report is not None
    assert report.skipped == ["broken"]
    assert kept in broken.instances
    assert ("delete", kept) not in broken.calls
    assert report.deleted == 1
    assert report.failed == 1
    assert len(flaky.instances) == 1
    assert {first, second} - set(flaky.instances)

    (skipped,) = await gc_events(jetstream_store, "broken")
    assert isinstance(skipped, SweepCompleted)
    assert skipped.skipped
    assert "listing timed out" in skipped.reason
    assert skipped.listed == 0
    results = [e for e in await gc_events(jetstream_store, "flaky") if isinstance(e, OrphanDeleted)]
    assert sorted(e.ok for e in results) == [False, True]
    (failure,) = [e for e in results if not e.ok]
    assert failure.error_class == "Permanent"
    assert "forbidden" in failure.error
    summary = (await gc_events(jetstream_store, "flaky"))[-1]
    assert isinstance(summary, SweepCompleted)
    assert (summary.deleted, summary.failed) == (1, 1)


async def test_one_replica_sweeps_at_a_time(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    slow = FakeProvider("slow", latency=0.5)
    await made(slow, "gone")
    a = collector(conn, jetstream_store, {"slow": slow})
    b = collector(conn, jetstream_store, {"slow": slow})
    try:
        results = await asyncio.gather(a.run_once(), b.run_once())
        assert sorted(r is None for r in results) == [False, True]
        assert [op for op, _ in slow.calls].count("list") == 1
        # Released at the end: the next round, by either replica, takes it again.
        assert (await b.run_once()) is not None
    finally:
        await a.close()
        await b.close()


async def test_a_dead_holders_lock_expires(conn: Connection) -> None:
    dead = SweepLock(conn.js, ttl=1.0, bucket="gc-lock-expiry")
    other = SweepLock(conn.js, ttl=1.0, bucket="gc-lock-expiry")
    assert await dead.try_acquire() is not None  # and never released: the holder "dies"
    assert await other.try_acquire() is None

    async def taken() -> bool:
        return await other.try_acquire() is not None

    await until(taken, timeout=10.0, every=0.2)


async def test_a_live_holder_keeps_its_lock_past_the_ttl(conn: Connection) -> None:
    holder = SweepLock(conn.js, ttl=1.0, bucket="gc-lock-refresh")
    other = SweepLock(conn.js, ttl=1.0, bucket="gc-lock-refresh")
    async with holder.hold() as held:
        assert held is not None
        first, loop = held.revision, asyncio.get_running_loop()
        taken = loop.time()

        def carried_past_the_ttl() -> bool:
            # The TTL running out is what is tested, so the clock is part of the condition: twice
            # the TTL gone by, and the lock re-written (each refresh moves its revision) meanwhile.
            return loop.time() - taken > 2 * holder.ttl and held.revision - first >= 3

        await until(carried_past_the_ttl, timeout=10.0, what="refreshes across twice the TTL")
        assert await other.try_acquire() is None
        assert not held.lost
    assert await other.try_acquire() is not None


async def test_service_sweeps_on_its_interval(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider("fake")
    metrics = Metrics()
    ctx = ServiceContext(Settings(nats_url=nats_server.url), conn, jetstream_store, metrics)
    service = GcService(None, Path("."), interval=0.2, grace=60.0, providers={"fake": fake})
    task = asyncio.create_task(service.run(ctx))
    try:
        pid = await made(fake, "gone")

        async def collected() -> bool:
            return pid not in fake.instances

        await until(collected, timeout=10.0)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    text = metrics.render().decode()
    assert 'egress_gc_deletes_total{provider="fake",result="ok"} 1.0' in text
    assert 'egress_provider_requests_total{op="delete",provider="fake",result="ok"} 1.0' in text


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalProvider]:
    provider = LocalProvider("local", tmp_path / "local", stop_grace=0.5)
    yield provider
    await delete_all(provider)


async def cli(*args: str) -> tuple[int, str]:
    """Standard output only: logs go to standard error, as ``main`` sets them up."""
    configure_logging("info", "console")
    runner = CliRunner()
    result = await asyncio.to_thread(
        runner.invoke, gc, ["run-once", *args], obj=CliState(), env={"COLUMNS": "200"}
    )
    return result.exit_code, result.stdout + result.stderr * (result.exit_code != 0)


async def test_cli_dry_run_then_run_with_real_proxies(
    nats_server: EmbeddedNatsServer,
    conn: Connection,
    jetstream_store: JetStreamEventStore,
    local: LocalProvider,
    tmp_path: Path,
) -> None:
    config = tmp_path / "providers.yaml"
    config.write_text(
        f"providers:\n  - name: local\n    type: local\n    local: {{dataDir: {local.data_dir}}}\n"
    )
    await declare(jetstream_store, "owner-live")

    def request(owner: str) -> CreateRequest:
        return CreateRequest(
            name=f"p-{owner}", owner_uid=owner, namespace="ns", proxy_name=owner, spec=ProxySpec()
        )

    orphan = await local.create(request("owner-gone"))
    kept = await local.create(request("owner-live"))

    async def serving() -> bool:
        states = {(await local.get(pid)).state for pid in (orphan, kept)}
        return states == {InstanceState.RUNNING}

    await until(serving, timeout=30.0, every=0.1)  # real proxies, listening
    common = ("--providers-config", str(config), "--nats-url", nats_server.url, "--grace", "0s")

    code, out = await cli("--dry-run", *common)
    assert code == 0, out
    assert orphan in out
    assert "would delete" in out
    assert kept not in out
    assert (await local.get(orphan)).owner_uid == "owner-gone"
    assert await gc_events(jetstream_store, "local") == []

    code, out = await cli(*common, "-o", "json")
    assert code == 0, out
    (entry,) = json.loads(out)["providers"]
    assert [o["providerId"] for o in entry["orphans"]] == [orphan]
    assert entry["orphans"][0]["result"] == "deleted"
    assert entry["deleted"] == 1
    with pytest.raises(NotFound):
        await local.get(orphan)
    assert (await local.get(kept)).owner_uid == "owner-live"
    kinds = [type(e).__name__ for e in await gc_events(jetstream_store, "local")]
    assert kinds == ["OrphanFound", "OrphanDeleted", "SweepCompleted"]
