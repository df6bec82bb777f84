"""The watcher against an emulated apiserver (real HTTP), a real nats-server, and the real
reconciler and executor on the fake provider: Proxy objects become proxies, and back."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from events.schemas import (
    CreateInstance,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyRemoved,
    ProxySpecChanged,
)
from services.providers.base import Transient
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from services.watcher.pure.crdschema import FINALIZER
from tests.support.kube import PROXIES
from tests.support.waiting import until
from tests.support.watcher_harness import NAMESPACE, Bench, bench

pytestmark = pytest.mark.integration


async def ready(b: Bench, name: str) -> bool:
    status = b.status(name)
    return status.get("phase") == "Ready" and bool(status.get("ip"))


async def test_create_becomes_ready_with_status_finalizer_and_events(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        replica = await b.watcher()
        uid = b.create("de-1", attributes={"country": "de"})
        await until(lambda: ready(b, "de-1"))
        obj = b.get("de-1")
        assert obj is not None
        assert FINALIZER in obj["metadata"]["finalizers"]
        status = b.status("de-1")
        # The printer columns' fields.
        assert status["phase"] == "Ready"
        assert status["ip"].startswith("10.0.0.")
        assert status["url"] == f"http://{status['ip']}:3128"
        assert status["providerID"]
        assert status["observedGeneration"] == 1
        assert status["health"] in ("Unknown", "Healthy", "Unhealthy")
        assert b.condition("de-1", "Ready")["status"] == "True"
        assert b.condition("de-1", "Provisioned")["status"] == "True"
        assert b.condition("de-1", "Ready")["lastTransitionTime"]
        declared = [e for e in await b.events(uid) if isinstance(e, ProxyDeclared)]
        assert len(declared) == 1
        assert declared[0].source == "kubernetes"
        assert declared[0].namespace == NAMESPACE

        async def described() -> bool:
            return any(e["reason"] == "InstanceRunning" for e in b.kube_events("de-1"))

        await until(described)
        # Patch only on change: no two successive status patches say the same thing.
        bodies = [
            r.data["status"]
            for r in b.kube.requests(
                lambda r: "PATCH" in str(r.method).upper() and r.url.path.endswith("/status")
            )
        ]
        assert len(bodies) >= 2
        assert all(a != z for a, z in itertools.pairwise(bodies))
        events = b.kube_events("de-1")
        assert all(e["source"]["component"] == "egress-proxies-watcher" for e in events)
        assert all(e["involvedObject"]["uid"] == uid for e in events)
        assert all(e["involvedObject"]["kind"] == "Proxy" for e in events)
        # What an operator graphs: leadership, listings, declarations, patches, Events.
        term = replica.service.term
        assert term is not None
        sample = term.sync.metrics.registry.get_sample_value
        assert sample("egress_watcher_leader") == 1
        assert (sample("egress_watcher_relists_total") or 0) >= 1
        assert sample("egress_watcher_declarations_total", {"result": "created"}) == 1
        assert (sample("egress_watcher_status_patches_total", {"result": "ok"}) or 0) >= 2
        assert (sample("egress_watcher_kube_events_total") or 0) >= 1


async def test_spec_edit_replaces_the_instance_and_shows_the_new_ip(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        await b.watcher()
        uid = b.create("de-1", placement={"zone": "a"})
        await until(lambda: ready(b, "de-1"))
        before = b.status("de-1")["ip"]
        b.kube.patch(PROXIES, NAMESPACE, "de-1", {"spec": {"placement": {"zone": "b"}}})

        async def replaced() -> bool:
            status = b.status("de-1")
            return (
                status.get("phase") == "Ready"
                and status.get("ip") not in ("", None, before)
                and status.get("observedGeneration") == 2
            )

        await until(replaced)
        assert await b.count(uid, ProxySpecChanged) == 1
        assert await b.count(uid, CreateInstance) == 2
        assert b.fake.live_per_owner() == {uid: 1}
        reasons = {e["reason"] for e in b.kube_events("de-1")}
        assert "SpecChanged" in reasons


async def test_delete_holds_the_finalizer_until_the_instance_is_gone(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        await b.watcher()
        uid = b.create("de-1")
        await until(lambda: ready(b, "de-1"))
        # The provider refuses to delete for a while: the instance outlives the request.
        for _ in range(6):
            b.fake.inject("delete", Transient("busy"))
        b.kube.delete(PROXIES, NAMESPACE, "de-1")

        async def requested() -> bool:
            return await b.count(uid, ProxyDeletionRequested) == 1

        await until(requested)
        obj = b.get("de-1")
        assert obj is not None
        assert obj["metadata"]["deletionTimestamp"]
        assert FINALIZER in obj["metadata"]["finalizers"]
        assert b.fake.live_per_owner() == {uid: 1}

        async def released() -> bool:
            return b.get("de-1") is None

        await until(released, timeout=30)
        assert b.fake.live_per_owner() == {}
        assert await b.count(uid, ProxyRemoved) == 1
        assert await b.count(uid, ProxyDeletionRequested) == 1
