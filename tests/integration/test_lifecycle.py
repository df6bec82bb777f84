"""The proxy lifecycle through reconciler and executor, on a real nats-server, fake provider."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from commands.declaring import apply, delete
from events import subjects
from events.customresource import cli_uid
from events.schemas import CreateInstance, ErrorClass, HealthChanged, Phase, ProxySpec
from events.store import NewEvent
from services.cli.fleet.manifests import parse_resources
from services.providers.base import Permanent, Transient
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from services.testing.provider import FakeProvider
from tests.support.lifecycle import fleet, phases, view
from tests.support.waiting import until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def doc(name: str, provider: str = "fake", zone: str = "a") -> str:
    return f"""
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {{name: {name}, namespace: crawl}}
spec:
  provider: {provider}
  placement: {{zone: {zone}}}
"""


async def declare(store: JetStreamEventStore, names: list[str], **kw: str) -> list[str]:
    uids = []
    for name in names:
        [resource] = parse_resources(doc(name, **kw), "test")
        uids.append((await apply(store, resource)).uid)
    return uids


async def all_in(store: JetStreamEventStore, uids: list[str], phase: Phase) -> bool:
    return all(p is phase for p in (await phases(store, uids)).values())


async def test_many_proxies_three_reconcilers_one_instance_each(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider(pending_polls=2)
    names = [f"p{i}" for i in range(200)]
    async with fleet(nats_server.url, {"fake": fake}, reconcilers=3):
        uids = await declare(jetstream_store, names)
        await until(lambda: all_in(jetstream_store, uids, Phase.READY), timeout=120, every=0.5)
    assert fake.created_total == 200
    assert set(fake.max_live_per_owner.values()) == {1}
    for uid in uids[:10]:
        v = await view(jetstream_store, uid)
        assert v is not None
        assert v.url.startswith("http://10.0.0.")
        history = await jetstream_store.read(subjects.proxy(uid))
        creates = [r for r in history.events if isinstance(r.event, CreateInstance)]
        assert len(creates) == 1


async def test_spec_change_replaces_and_the_old_instance_is_gone(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider()
    async with fleet(nats_server.url, {"fake": fake}):
        [uid] = await declare(jetstream_store, ["r1"])
        await until(lambda: all_in(jetstream_store, [uid], Phase.READY))
        before = await view(jetstream_store, uid)
        assert before is not None
        await declare(jetstream_store, ["r1"], zone="b")

        async def replaced() -> bool:
            v = await view(jetstream_store, uid)
            return v is not None and v.phase is Phase.READY and v.ip != before.ip

        await until(replaced)
    after = await view(jetstream_store, uid)
    assert after is not None
    assert after.provider_id != before.provider_id
    assert before.provider_id not in fake.instances
    assert list(fake.instances) == [after.provider_id]
    assert fake.max_live_per_owner[uid] == 1, "delete, wait for NotFound, then create"


async def settled(conn: Connection) -> bool:
    """Every message of the PROXY stream handled and acknowledged by every consumer: none waits
    for a redelivery, which is how a command is retried (``Retry``, a delayed nak)."""
    infos = await conn.js.consumers_info(subjects.PROXY_STREAM)
    return bool(infos) and all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos)


async def test_permanent_error_latches_failed_with_the_message(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, conn: Connection
) -> None:
    fake = FakeProvider()
    fake.inject("create", Permanent("image debian-13 not found"))
    async with fleet(nats_server.url, {"fake": fake}):
        [uid] = await declare(jetstream_store, ["bad"])
        await until(lambda: all_in(jetstream_store, [uid], Phase.FAILED))
        await until(lambda: settled(conn), what="the commands settled, no retry scheduled")
        v = await view(jetstream_store, uid)
    assert v is not None
    assert v.phase is Phase.FAILED
    assert "image debian-13 not found" in v.message
    assert fake.created_total == 0
    assert [op for op, _ in fake.calls].count("create") == 1, "latched: never retried"


async def test_transient_errors_are_retried(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider()
    fake.inject("create", Transient("503 backend unavailable"), times=3)
    async with fleet(nats_server.url, {"fake": fake}):
        [uid] = await declare(jetstream_store, ["flaky"])
        await until(lambda: all_in(jetstream_store, [uid], Phase.READY))
    assert fake.created_total == 1
    assert [op for op, _ in fake.calls].count("create") == 4


async def test_unknown_provider_fails_with_a_reason(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with fleet(nats_server.url, {"fake": FakeProvider()}):
        [uid] = await declare(jetstream_store, ["nowhere"], provider="gcp-mars")
        await until(lambda: all_in(jetstream_store, [uid], Phase.FAILED))
    v = await view(jetstream_store, uid)
    assert v is not None
    assert "gcp-mars" in v.message


async def test_vanished_instance_is_recreated_and_deletion_removes(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider()
    async with fleet(nats_server.url, {"fake": fake}):
        [uid] = await declare(jetstream_store, ["v1"])
        await until(lambda: all_in(jetstream_store, [uid], Phase.READY))
        first = await view(jetstream_store, uid)
        assert first is not None
        fake.vanish(first.provider_id)

        async def recreated() -> bool:
            return fake.created_total == 2 and await all_in(jetstream_store, [uid], Phase.READY)

        await until(recreated)
        assert (await delete(jetstream_store, "crawl", "v1")).result == "deleted"

        async def removed() -> bool:
            v = await view(jetstream_store, uid)
            return v is not None and v.removed

        await until(removed)
    assert fake.instances == {}


async def test_reconciler_killed_mid_create_converges_without_duplicates(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """The reconciler runs as its own process and is SIGKILLed while proxies are being created."""
    fake = FakeProvider(pending_polls=3, latency=0.02)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NATS_URL": nats_server.url}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)

    async def reconciler() -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.cli.main",
            "run",
            "reconciler",
            "--metrics-port",
            "0",
            env=env,
            cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )

    names = [f"k{i}" for i in range(200)]
    uids = [cli_uid("crawl", n) for n in names]
    async with fleet(nats_server.url, {"fake": fake}, reconcilers=0):
        first = await reconciler()
        await declare(jetstream_store, names)

        async def some_ready() -> bool:
            # One cheap look: by the time the first proxy is Ready, the rest are mid-flight.
            first_view = await view(jetstream_store, uids[0])
            return first_view is not None and first_view.phase is Phase.READY

        await until(some_ready, timeout=60, every=0.02)
        first.send_signal(signal.SIGKILL)
        await first.wait()
        assert not await all_in(jetstream_store, uids, Phase.READY), "killed too late to matter"
        second = await reconciler()
        try:
            await until(lambda: all_in(jetstream_store, uids, Phase.READY), timeout=90, every=0.5)
        finally:
            second.send_signal(signal.SIGTERM)
            await second.wait()
    assert fake.created_total == 200
    assert set(fake.max_live_per_owner.values()) == {1}
    for uid in uids:
        history = await jetstream_store.read(subjects.proxy(uid))
        assert sum(isinstance(r.event, CreateInstance) for r in history.events) == 1


def test_error_class_names_match_the_contract() -> None:
    assert {c.value for c in ErrorClass} == {"NotFound", "QuotaExceeded", "Transient", "Permanent"}
    assert ProxySpec().mode.value == "Managed"


async def test_instance_unhealthy_too_long_is_replaced(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider()
    async with fleet(nats_server.url, {"fake": fake}, replace_unhealthy_after=0.5):
        [uid] = await declare(jetstream_store, ["sick"])
        await until(lambda: all_in(jetstream_store, [uid], Phase.READY))
        first = await view(jetstream_store, uid)
        assert first is not None
        verdict = HealthChanged(healthy=False, reason="ProbeTimeout", provider_id=first.provider_id)
        await jetstream_store.append(subjects.proxy(uid), [NewEvent(verdict, "sick-1")])

        async def replaced() -> bool:
            v = await view(jetstream_store, uid)
            return v is not None and v.phase is Phase.READY and v.ip != first.ip

        await until(replaced)
    after = await view(jetstream_store, uid)
    assert after is not None
    assert after.healthy is None, "a new instance has no verdict yet"
    assert fake.created_total == 2
    assert fake.max_live_per_owner[uid] == 1
