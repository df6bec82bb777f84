"""A check URL the proxy's own destination rules refuse is named as such in the health verdict,
with the fixes, not taken for a dead proxy or a site that blocks it
(docs/decisions/0134-where-a-proxy-lets-its-holder-go.md).

A real Squid from the local provider, whose rules refuse link-local addresses and CONNECT to
private ones; a real health replica on a real nats-server probing through it.
"""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize(
    "check_url",
    [
        "http://169.254.169.254/latest/meta-data/",  # link-local: refused by every proxy
        "https://10.255.255.254/generate_204",  # CONNECT to a private range not listed
    ],
)
async def test_a_check_url_refused_by_the_proxys_rules_says_so_and_how_to_fix_it(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    squid: Squid,
    target: RecordingTarget,
    check_url: str,
) -> None:
    await declare_ready(jetstream_store, "p1", squid.url, fast_check(check_url, failures=1))
    replica = await start_replica(nats_server.url, replica_service("solo", target.url()))
    try:

        async def judged() -> bool:
            return bool(await health_events(jetstream_store, "p1"))

        await until(judged)
    finally:
        await replica.stop()
    verdict = (await health_events(jetstream_store, "p1"))[0]
    assert verdict.healthy is False
    assert f"the proxy's own destination rules refuse {check_url}" in verdict.message
    assert "ERR_ACCESS_DENIED" in verdict.message
    assert "allowedTargets" in verdict.message
    assert "spec.healthCheck.url" in verdict.message
    assert "did not accept the connection" not in verdict.message
    assert not target.requests  # nothing went anywhere else meanwhile
