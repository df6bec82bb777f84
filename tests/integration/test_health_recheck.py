"""Holders' ``failed`` reports make the health service probe a proxy at once: a real nats-server,
a real Squid, a real origin behind it, and lease events appended as discovery appends them.

Each proxy here is probed every 600 s and has a uid whose first probe falls minutes after the
start (``phase_of``), so within a test every probe that reaches the origin is a recheck. The
replica connects as the ``health`` NATS user: it may read the ``LEASE`` stream, nothing more.
"""

from __future__ import annotations

import uuid

import pytest

from events import subjects
from events.schemas import HealthCheck, LeaseAcquired, LeaseReported
from events.store import NewEvent, derive_msg_id
from services.health.scheduler import phase_of
from services.health.service import HealthService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.health import (
    RecordingTarget,
    Replica,
    Squid,
    declare_ready,
    health_events,
    start_replica,
)
from tests.support.waiting import until

pytestmark = pytest.mark.integration

INTERVAL = 600.0


def slow_check(url: str) -> HealthCheck:
    """One probe is a verdict either way, and the next regular one is minutes away."""
    return HealthCheck(
        url=url,
        interval_seconds=INTERVAL,
        timeout_seconds=2.0,
        failure_threshold=1,
        success_threshold=1,
    )


def service(every: int, check_url: str) -> HealthService:
    return HealthService(
        check_url=check_url,
        heartbeat=0.2,
        replica_id="solo",
        latency_band_ms=0,
        failed_reports_recheck=every,
    )


async def ready(
    store: JetStreamEventStore, uid: str, squid: Squid, target: RecordingTarget
) -> None:
    assert phase_of(uid) * INTERVAL > 300, f"{uid}: its first regular probe would come too soon"
    await declare_ready(store, uid, squid.url, slow_check(target.url()))


async def lease(store: JetStreamEventStore, uid: str) -> str:
    """A granted lease on ``uid``, claimed as discovery claims one."""
    lease_id = f"lease-{uid}"
    claim = LeaseAcquired(lease_id=lease_id, proxy_uid=uid, holder="crawler", ttl_seconds=3600)
    await store.append(
        subjects.lease(uid),
        [NewEvent(claim, derive_msg_id("lease-acquired", lease_id))],
        expected_seq=0,
    )
    return lease_id


async def report(store: JetStreamEventStore, uid: str, lease_id: str, outcome: str) -> int:
    """One report, appended as discovery appends it; its stream sequence."""
    event = LeaseReported(
        lease_id=lease_id, proxy_uid=uid, outcome=outcome, target="shop.example", detail="test"
    )
    msg_id = derive_msg_id("lease-reported", lease_id, str(uuid.uuid4()))
    result = await store.append(subjects.lease(uid), [NewEvent(event, msg_id)])
    return result.last_seq


async def probing(replica: Replica, uid: str) -> None:
    """Until the replica owns ``uid`` and probes it (it has caught up with both streams)."""

    def owned() -> bool:
        prober = replica.service.prober
        return prober is not None and uid in prober.owned

    await until(owned, what=f"the replica probing {uid}")


async def handled(replica: Replica, seq: int) -> None:
    """Until the replica has folded the LEASE stream up to ``seq`` and acted on it."""
    reports = replica.service.reports
    assert reports is not None
    await until(lambda: reports.handled_seq >= seq, what=f"LEASE handled up to {seq}")


def rechecks(replica: Replica, uid: str) -> int:
    assert replica.service.prober is not None
    return replica.service.prober.rechecks[uid]


def probes(replica: Replica, uid: str) -> int:
    assert replica.service.prober is not None
    return replica.service.prober.probes[uid]


async def test_the_third_failed_report_in_a_row_gets_a_probe_at_once_the_second_does_not(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    conn: Connection,
    squid: Squid,
    target: RecordingTarget,
) -> None:
    uid = "p1"
    await ready(jetstream_store, uid, squid, target)
    target.status = 503  # what the holders saw: the proxy does not get through
    replica = await start_replica(nats_server.url_for("health"), service(3, target.url()))
    try:
        await probing(replica, uid)
        assert len(await conn.js.consumers_info(subjects.LEASE_STREAM)) == 1
        lease_id = await lease(jetstream_store, uid)
        # A success in between starts the count again: four failed, but at most two in a row.
        for outcome in ["failed", "failed", "success", "failed"]:
            seq = await report(jetstream_store, uid, lease_id, outcome)
        seq = await report(jetstream_store, uid, lease_id, "failed")
        await handled(replica, seq)
        assert rechecks(replica, uid) == 0
        assert probes(replica, uid) == 0
        assert target.requests == []
        assert await health_events(jetstream_store, uid) == []

        await report(jetstream_store, uid, lease_id, "failed")

        async def judged() -> bool:
            return bool(await health_events(jetstream_store, uid))

        await until(judged, what="a verdict after the third failed report")
        (verdict,) = await health_events(jetstream_store, uid)
        assert verdict.healthy is False
        assert verdict.reason == "ProbeFailed"
        assert rechecks(replica, uid) == 1
        assert probes(replica, uid) == 1
        assert [line for line, _ in target.requests] == ["GET /check HTTP/1.1"]
    finally:
        await replica.stop()


async def test_history_sets_the_streak_but_only_a_new_report_reaching_a_multiple_probes(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    squid: Squid,
    target: RecordingTarget,
) -> None:
    """Three failed reports before the replica starts: its catch-up probes nothing. The
    fourth (4 is no multiple of 3) probes nothing either; the sixth (2N) does."""
    uid = "hist1"
    await ready(jetstream_store, uid, squid, target)
    lease_id = await lease(jetstream_store, uid)
    for _ in range(3):
        await report(jetstream_store, uid, lease_id, "failed")
    replica = await start_replica(nats_server.url_for("health"), service(3, target.url()))
    try:
        await probing(replica, uid)
        seq = await report(jetstream_store, uid, lease_id, "failed")
        await handled(replica, seq)
        assert rechecks(replica, uid) == 0
        assert probes(replica, uid) == 0

        await report(jetstream_store, uid, lease_id, "failed")
        seq = await report(jetstream_store, uid, lease_id, "failed")
        await handled(replica, seq)
        assert rechecks(replica, uid) == 1

        async def judged() -> bool:
            return bool(await health_events(jetstream_store, uid))

        await until(judged, what="a verdict after the sixth failed report")
        (verdict,) = await health_events(jetstream_store, uid)
        assert verdict.healthy is True  # the origin answers: the probe finds the proxy fine
        assert probes(replica, uid) == 1
        assert len(target.requests) == 1
    finally:
        await replica.stop()


async def test_zero_turns_it_off_and_the_lease_stream_is_not_read(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    conn: Connection,
    squid: Squid,
    target: RecordingTarget,
) -> None:
    uid = "off1"
    await ready(jetstream_store, uid, squid, target)
    replica = await start_replica(nats_server.url_for("health"), service(0, target.url()))
    try:
        await probing(replica, uid)
        assert replica.service.reports is None
        lease_id = await lease(jetstream_store, uid)
        for _ in range(6):
            await report(jetstream_store, uid, lease_id, "failed")
        # Nothing of this replica reads LEASE, so no report can reach its prober.
        assert await conn.js.consumers_info(subjects.LEASE_STREAM) == []
        assert rechecks(replica, uid) == 0
        assert probes(replica, uid) == 0
        assert target.requests == []
    finally:
        await replica.stop()
