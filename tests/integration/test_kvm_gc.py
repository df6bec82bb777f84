"""GC removes the volumes a kvm VM left behind without its domain: a real libvirtd over real SSH,
a real nats-server for the proxy view and the ``GC`` events.

The domains are undefined behind the provider's back (what a delete cut off between its undefine
and its volume deletes leaves), so only the overlay and seed remain in the pool.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from events import subjects
from events.schemas import (
    Event,
    OrphanDeleted,
    OrphanFound,
    Placement,
    ProxyDeclared,
    ProxySpec,
    SweepCompleted,
)
from events.store import NewEvent, derive_msg_id
from services.gc.collector import GarbageCollector
from services.gc.lock import SweepLock
from services.gc.sweep import EPOCH, sweep_once
from services.providers.base import CreateRequest, Leftover, Permanent
from services.providers.instrumented import instrument
from services.providers.kvm.provider import KvmProvider
from services.providers.kvm.pure.domain import base_name, marker_name, overlay_name, seed_name
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.observability.metrics import Metrics
from tests.support.kvm_daemon import LibvirtDaemon, pool_volumes
from tests.support.kvm_fixtures import *  # noqa: F403  # pytest finds fixtures by name here

pytestmark = [pytest.mark.integration, pytest.mark.kvm]

# What the reconciler names VMs (px-<owner uid>-<spec hash>): the owner is read from the name.
GONE_OWNER, GONE_VM = "1f3a", "px-1f3a-0123abcd"
LIVE_OWNER, LIVE_VM = "2b4c", "px-2b4c-89abcdef"


def request(name: str, owner: str) -> CreateRequest:
    return CreateRequest(
        name=name,
        owner_uid=owner,
        namespace="default",
        proxy_name=name,
        spec=ProxySpec(provider="kvm", placement=Placement()),
        cloud_init="#cloud-config\n",
    )


def undefine_behind_its_back(libvirtd: LibvirtDaemon, *names: str) -> None:
    conn = libvirtd.connect()
    try:
        for name in names:
            dom = conn.lookupByName(name)
            dom.destroy()
            dom.undefine()
    finally:
        conn.close()


def volumes_of(name: str) -> set[str]:
    return {overlay_name(name), seed_name(name)}


async def declare(store: JetStreamEventStore, uid: str) -> None:
    event = ProxyDeclared(uid=uid, namespace="default", name=uid, spec=ProxySpec(provider="kvm"))
    await store.append(subjects.proxy(uid), [NewEvent(event, derive_msg_id("test", uid))])


async def gc_events(store: JetStreamEventStore) -> list[Event]:
    return list((await store.read(subjects.gc("kvm"))).decoded())


async def test_gc_deletes_the_volumes_of_a_gone_owner_and_keeps_a_live_ones(
    provider: KvmProvider,
    libvirtd: LibvirtDaemon,
    pool: str,
    conn: Connection,
    jetstream_store: JetStreamEventStore,
) -> None:
    await provider.create(request(GONE_VM, GONE_OWNER))
    await provider.create(request(LIVE_VM, LIVE_OWNER))
    undefine_behind_its_back(libvirtd, GONE_VM, LIVE_VM)
    await declare(jetstream_store, LIVE_OWNER)
    base = base_name(provider.config.images["tiny"])
    before = pool_volumes(libvirtd, pool)
    assert before == {base, marker_name(base)} | volumes_of(GONE_VM) | volumes_of(LIVE_VM)

    # Just written, so within any grace: a create in flight looks exactly like this.
    young = await sweep_once({"kvm": provider}, set(), datetime.now(UTC), 3600.0)
    assert young.providers[0].leftovers is not None
    assert young.providers[0].leftovers.young == 4
    assert young.leftovers == 0
    assert pool_volumes(libvirtd, pool) == before

    metrics = Metrics()
    gcol = GarbageCollector(
        conn.js,
        jetstream_store,
        {"kvm": instrument(provider, metrics)},
        grace=0.0,
        lock=SweepLock(conn.js, ttl=30.0),
        registry=metrics.registry,
    )
    try:
        report = await gcol.run_once()
    finally:
        await gcol.close()
    assert report is not None
    assert pool_volumes(libvirtd, pool) == {base, marker_name(base)} | volumes_of(LIVE_VM)
    left = report.providers[0].leftovers
    assert left is not None
    expected = {f"hosts/hv1/volumes/{pool}/{v}" for v in volumes_of(GONE_VM)}
    assert set(left.deleted) == expected
    assert (left.in_use, left.failed, left.skipped) == ([], [], False)

    events = await gc_events(jetstream_store)
    found = {e.provider_id: (e.kind, e.owner_uid) for e in events if isinstance(e, OrphanFound)}
    assert found == dict.fromkeys(expected, ("volume", GONE_OWNER))
    deleted = [e for e in events if isinstance(e, OrphanDeleted)]
    assert {e.provider_id for e in deleted} == expected
    assert all(e.ok and e.kind == "volume" for e in deleted)
    (completed,) = [e for e in events if isinstance(e, SweepCompleted)]
    assert (completed.listed, completed.orphans) == (0, 0)  # no domain is left to list
    assert (completed.leftovers, completed.leftovers_deleted) == (2, 2)

    def sample(name: str, labels: dict[str, str]) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    kvm_volume = {"provider": "kvm", "kind": "volume"}
    assert sample("egress_gc_leftovers_found_total", kvm_volume) == 2.0
    assert sample("egress_gc_leftover_deletes_total", {**kvm_volume, "result": "ok"}) == 2.0
    requests = {"provider": "kvm", "op": "delete_leftover", "result": "ok"}
    assert sample("egress_provider_requests_total", requests) == 2.0

    # The volumes of the live owner are kept round after round.
    again = await sweep_once({"kvm": provider}, {LIVE_OWNER}, datetime.now(UTC), 0.0)
    assert again.leftovers == 0
    assert volumes_of(LIVE_VM) <= pool_volumes(libvirtd, pool)


async def test_delete_leftover_touches_only_per_vm_volumes_of_the_configured_pool(
    provider: KvmProvider, libvirtd: LibvirtDaemon, pool: str
) -> None:
    await provider.create(request(GONE_VM, GONE_OWNER))
    undefine_behind_its_back(libvirtd, GONE_VM)
    base = base_name(provider.config.images["tiny"])
    refused = [
        f"hosts/hv1/volumes/{pool}/{base}",  # the image every overlay backs onto
        f"hosts/hv1/volumes/{pool}/{marker_name(base)}",
        f"hosts/hv1/volumes/{pool}/vm-hand-made.qcow2",  # not a name the reconciler makes
        f"hosts/hv1/volumes/other-pool/{overlay_name(GONE_VM)}",
        f"hosts/hv9/volumes/{pool}/{overlay_name(GONE_VM)}",
        f"hosts/hv1/domains/{GONE_VM}",
    ]
    for provider_id in refused:
        with pytest.raises(Permanent):
            await provider.delete_leftover(Leftover(provider_id, GONE_OWNER, EPOCH, "volume"))
    assert pool_volumes(libvirtd, pool) == {base, marker_name(base)} | volumes_of(GONE_VM)

    (overlay,) = [o for o in await provider.leftovers() if o.provider_id.endswith(".qcow2")]
    assert await provider.delete_leftover(overlay)
    # Gone already (deleted by hand, or by a delete that resumed): the goal is reached.
    assert await provider.delete_leftover(overlay)
    assert pool_volumes(libvirtd, pool) == {base, marker_name(base), seed_name(GONE_VM)}
