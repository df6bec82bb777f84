"""The gcp provider inside the executor, with a real nats-server: commands in, instance events out,
every call through the real Compute client to the local fake. What the reconciler will read is
what these tests assert."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from events.schemas import (
    CreateInstance,
    DeleteInstance,
    ErrorClass,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    Placement,
    ProviderFailed,
    ProxySpec,
)
from services.providers.gcp.provider import GcpProvider
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.testing.gcp import ComputeFake
from tests.support.executor_harness import answered, answers, declare, executor, send, settled
from tests.support.gcp_support import PROJECT, config

pytestmark = pytest.mark.integration

SPEC = ProxySpec(
    provider="gcp-eu", placement=Placement(zone="europe-west1-c", machine_type="e2-micro")
)


@pytest.fixture
def fake() -> Iterator[ComputeFake]:
    with ComputeFake(PROJECT) as server:
        yield server


def create(command_id: str) -> CreateInstance:
    return CreateInstance(
        command_id=command_id, provider="gcp-eu", instance_name=f"px-{command_id}", spec=SPEC
    )


async def test_create_quota_then_running_then_delete(
    conn: Connection, jetstream_store: JetStreamEventStore, fake: ComputeFake
) -> None:
    provider = GcpProvider("gcp-eu", config(fake))
    fake.inject(403, "quotaExceeded", kind="insert", message="Quota 'CPUS' exceeded. Limit: 24")
    await declare(jetstream_store, "g1")
    try:
        async with executor(conn, jetstream_store, {"gcp-eu": provider}):
            await send(jetstream_store, "g1", create("c1"))
            got = await answered(jetstream_store, "g1", InstanceObserved)
            pid = "zones/europe-west1-c/instances/px-c1"
            body = fake.instances[("europe-west1-c", "px-c1")].body
            assert body["labels"]["egress_proxies_owner_uid"] == "g1"  # the proxy's uid
            assert body["machineType"] == "zones/europe-west1-c/machineTypes/e2-micro"
            await send(
                jetstream_store,
                "g1",
                DeleteInstance(command_id="d1", provider="gcp-eu", provider_id=pid),
            )
            await answered(jetstream_store, "g1", InstanceGone)
            await settled(conn)
    finally:
        await provider.close()
    quota, created, running = got
    assert isinstance(quota, ProviderFailed)
    assert quota.error_class is ErrorClass.QUOTA_EXCEEDED
    assert "Quota 'CPUS' exceeded" in quota.message
    assert created == InstanceCreated(command_id="c1", provider="gcp-eu", provider_id=pid)
    assert isinstance(running, InstanceObserved)
    assert running.state is InstanceState.RUNNING
    assert running.url == "http://10.0.0.1:3128"
    assert running.instance_uid
    last = (await answers(jetstream_store, "g1"))[-1]
    assert last == InstanceGone(command_id="d1", provider="gcp-eu", provider_id=pid)
    assert fake.instances == {}
    assert fake.inserted_total == 1


async def test_a_bad_image_is_answered_permanent_once(
    conn: Connection, jetstream_store: JetStreamEventStore, fake: ComputeFake
) -> None:
    provider = GcpProvider("gcp-eu", config(fake))
    fake.inject(404, "notFound", kind="insert", message="The resource 'img/x' was not found")
    await declare(jetstream_store, "g2")
    try:
        async with executor(conn, jetstream_store, {"gcp-eu": provider}):
            await send(jetstream_store, "g2", create("c2"))
            got = await answered(jetstream_store, "g2", ProviderFailed)
            await settled(conn)
    finally:
        await provider.close()
    (failed,) = got
    assert isinstance(failed, ProviderFailed)
    assert failed.error_class is ErrorClass.PERMANENT
    assert "img/x" in failed.message
    inserts = [path for method, path in fake.requests if method == "POST"]
    assert len(inserts) == 1
