"""The fleet gauges, scraped from a real discovery service on a real nats-server: right for a small
known fleet, and accepted by ``promtool check metrics`` (docs/operations.md, "Metrics, dashboard
and alerts")."""

from __future__ import annotations

import asyncio
import shutil
from asyncio.subprocess import PIPE, STDOUT

import httpx
import pytest
from nats.js.api import AckPolicy, ConsumerConfig
from prometheus_client.parser import text_string_to_metric_families

from events import subjects
from events.schemas import DeadLettered, Phase
from events.store import NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.metrics import Metrics, NatsConnections, metric_set
from tests.support.discovery import discovery, ready_proxy

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def promtool() -> str:
    """promtool from Debian's ``prometheus`` package (``sh deploy/host-packages.sh test``): a
    missing one fails the test, it is not skipped."""
    path = shutil.which("promtool")
    assert path, "promtool is missing: install it with `sh deploy/host-packages.sh test`"
    return path


def samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in found, f"{name}{labels} is not exported"
    return found[key]


async def test_fleet_gauges_count_a_known_fleet_and_pass_promtool(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    store = jetstream_store
    await ready_proxy(store, "p1", {"country": "de"})
    await ready_proxy(store, "p2", {"country": "de"})
    await ready_proxy(store, "p3", {"country": "fr"}, healthy=False)
    await ready_proxy(store, "p4", {"country": "de"}, phase=Phase.PROVISIONING, healthy=None)
    dead = DeadLettered(
        consumer="reconciler",
        stream=subjects.PROXY_STREAM,
        subject="proxy.p9.declared",
        sequence=1,
        deliveries=5,
        reason="gave up: test",
        payload="{}",
    )
    await store.append(subjects.deadletter("reconciler"), [NewEvent(dead, "dead-1")])
    # The reconciler's durable, as its consumer loop makes it, with nothing delivered yet.
    proxy_messages = (await conn.js.stream_info(subjects.PROXY_STREAM)).state.messages
    await conn.js.add_consumer(
        subjects.PROXY_STREAM,
        ConsumerConfig(durable_name="reconciler", ack_policy=AckPolicy.EXPLICIT),
    )
    metrics = Metrics()
    metric_set(metrics.registry, NatsConnections).watch("discovery", conn)

    async with (
        discovery(nats_server.url, metrics=metrics) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=10) as api,
    ):
        got = await api.post("/v1/leases", json={"selector": {"country": "de"}, "holder": "c"})
        assert got.status_code == 201, got.text
        refused = await api.post(
            "/v1/leases", json={"selector": {"country": "fr"}, "waitSeconds": 0.1}
        )
        assert refused.status_code == 503, refused.text
        unknown = await api.post("/v1/leases", json={"selector": {"country": "xx", "tier": "a"}})
        assert unknown.status_code == 422, unknown.text
        scraped = await api.get("/metrics")
        assert scraped.status_code == 200

    text = scraped.text
    checker = await asyncio.create_subprocess_exec(
        promtool(), "check", "metrics", stdin=PIPE, stdout=PIPE, stderr=STDOUT
    )
    said, _ = await checker.communicate(text.encode())
    assert checker.returncode == 0, said.decode()

    found = samples(text)
    local = {"provider": "local"}
    assert value(found, "egress_proxies", phase="Ready", **local) == 3
    assert value(found, "egress_proxies", phase="Provisioning", **local) == 1
    assert value(found, "egress_proxies", phase="Failed", **local) == 0
    assert value(found, "egress_proxies_healthy", **local) == 2
    assert value(found, "egress_proxies_unhealthy", **local) == 1
    assert value(found, "egress_proxies_leased", **local) == 1
    assert value(found, "egress_proxies_available", **local) == 1
    assert value(found, "egress_proxies_cooling_down", **local) == 0
    assert value(found, "egress_proxies_backoff", **local) == 0

    by_keys = "egress_lease_requests_by_selector_total"
    assert value(found, by_keys, selector_keys="1", result="acquired") == 1
    assert value(found, by_keys, selector_keys="1", result="busy") == 1
    assert value(found, by_keys, selector_keys="2", result="no_match") == 1
    waited = "egress_lease_request_wait_seconds_count"
    assert value(found, waited, selector_keys="1", result="busy") == 1

    assert value(found, "egress_dead_letters", consumer="reconciler") == 1
    assert value(found, "egress_dead_letters", consumer="executor") == 0
    assert value(found, "egress_consumer_pending_messages", consumer="reconciler") == (
        proxy_messages
    )
    assert value(found, "egress_consumer_ack_pending_messages", consumer="reconciler") == 0
    assert value(found, "egress_log_state_age_seconds") >= 0
    assert value(found, "egress_nats_connected", service="discovery") == 1
    # No label names a proxy: the series stay as few as the providers and consumers.
    assert not any(
        value_ in {"p1", "p2", "p3", "p4"} for _, labels in found for _, value_ in labels
    )
