"""The health prober against a real nats-server, real Squid processes and a real HTTP origin."""

from __future__ import annotations

import pytest

from services.health.service import HealthService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.health import (
    RecordingTarget,
    Squid,
    declare_ready,
    fast_check,
    health_events,
    replica_service,
    start_replica,
)
from tests.support.waiting import until

pytestmark = pytest.mark.integration


async def test_killed_squid_turns_unhealthy_and_a_new_process_restores_it(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    squid: Squid,
    target: RecordingTarget,
) -> None:
    await declare_ready(jetstream_store, "p1", squid.url, fast_check(target.url(), failures=3))
    replica = await start_replica(nats_server.url, replica_service("solo", target.url()))
    try:

        async def events(n: int) -> bool:
            return len(await health_events(jetstream_store, "p1")) >= n

        await until(lambda: events(1))
        first = await health_events(jetstream_store, "p1")
        assert [(e.healthy, e.provider_id) for e in first] == [(True, "inst-p1")]
        assert "first verdict" in first[0].message

        squid.kill()
        await until(lambda: events(2))
        down = (await health_events(jetstream_store, "p1"))[1]
        assert down.healthy is False
        assert down.reason == "ProbeFailed"
        # Recorded at the failureThreshold-th failing probe, not later.
        assert "failed: 3 consecutive probe(s) failed" in down.message

        await squid.restart()
        await until(lambda: events(3))
        assert [e.healthy for e in await health_events(jetstream_store, "p1")] == [
            True,
            False,
            True,
        ]
        assert target.requests, "the probes reached the origin through Squid"
    finally:
        await replica.stop()


async def test_events_are_appended_only_on_transitions(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    squid: Squid,
    target: RecordingTarget,
) -> None:
    uids = ["a1", "a2", "a3"]
    for uid in uids:
        await declare_ready(jetstream_store, uid, squid.url, fast_check(target.url()))
    replica = await start_replica(nats_server.url, replica_service("solo", target.url()))
    probes = replica.service

    async def probed_at_least(n: int) -> bool:
        prober = probes.prober
        return prober is not None and all(prober.probes[uid] >= n for uid in uids)

    async def events_per_proxy(n: int) -> bool:
        return all([len(await health_events(jetstream_store, uid)) >= n for uid in uids])

    try:
        await until(lambda: probed_at_least(15))
        target.status = 503  # the site answers errors: the proxies look broken from outside
        await until(lambda: events_per_proxy(2))
        assert probes.prober is not None
        mark = {uid: probes.prober.probes[uid] for uid in uids}
        await until(lambda: probed_at_least(max(mark.values()) + 10))
        target.status = 200
        await until(lambda: events_per_proxy(3))
        await until(lambda: probed_at_least(max(mark.values()) + 25))
        for uid in uids:
            assert [e.healthy for e in await health_events(jetstream_store, uid)] == [
                True,
                False,
                True,
            ]
        assert sum(probes.prober.probes[uid] for uid in uids) >= 75
    finally:
        await replica.stop()


async def test_a_provider_check_url_is_probed_and_a_failure_names_what_was_fetched(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    squid: Squid,
    target: RecordingTarget,
) -> None:
    """The proxy's provider (``local``) has its own check URL, which wins over the default; an
    unreachable default would make every probe fail. When the check then fails, the verdict
    says which URL was fetched and how to change it."""
    await declare_ready(jetstream_store, "p1", squid.url, fast_check("", failures=1))
    unreachable = "http://127.0.0.1:9/nothing-here"
    probes = HealthService(
        check_url=unreachable,
        provider_check_urls={"local": target.url("/local")},
        heartbeat=0.2,
        replica_id="solo",
        latency_band_ms=0,
    )
    replica = await start_replica(nats_server.url, probes)
    try:

        async def events(n: int) -> bool:
            return len(await health_events(jetstream_store, "p1")) >= n

        await until(lambda: events(1))
        assert (await health_events(jetstream_store, "p1"))[0].healthy is True
        assert any("/local" in line for line, _ in target.requests)

        await target.close()
        await until(lambda: events(2))
        down = (await health_events(jetstream_store, "p1"))[1]
        assert down.healthy is False
        assert target.url("/local") in down.message
        assert "spec.healthCheck.url or --health-check-url" in down.message
    finally:
        await replica.stop()


async def test_a_proxy_that_refuses_the_connection_is_not_blamed_on_the_check_url(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    squid: Squid,
    target: RecordingTarget,
) -> None:
    """A dead Squid refuses the probe's connection: no check URL would change that, so the
    verdict says the proxy is not there instead of suggesting spec.healthCheck.url."""
    await declare_ready(jetstream_store, "p1", squid.url, fast_check(target.url("/"), failures=1))
    probes = HealthService(heartbeat=0.2, replica_id="solo", latency_band_ms=0)
    replica = await start_replica(nats_server.url, probes)
    try:

        async def events(n: int) -> bool:
            return len(await health_events(jetstream_store, "p1")) >= n

        await until(lambda: events(1))
        assert (await health_events(jetstream_store, "p1"))[0].healthy is True
        squid.kill()
        await until(lambda: events(2))
        gone = (await health_events(jetstream_store, "p1"))[1]
        assert gone.healthy is False
        assert "did not accept the connection" in gone.message
        assert "healthCheck.url" not in gone.message
    finally:
        await replica.stop()
