"""The hetzner entry's firewall and the GC: made once with exactly ``allowedClients`` on the proxy
port, attached at each create, reused by every instance and replica, a leftover only once no
server is left, deleted by the real GC (grace and dry run), made again by the next create; and the
user data a server gets through the lease wrapper. The fake stands in for Hetzner; a real
nats-server holds the proxies and the GC's events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from events import subjects
from events.schemas import (
    OrphanDeleted,
    OrphanFound,
    SweepCompleted,
)
from services.gc.collector import GarbageCollector
from services.gc.lock import SweepLock
from services.gc.sweep import sweep_once
from services.providers.base import Leftover, LeftoverCleaner, NotFound, Permanent, Transient
from services.providers.cloud.pure.firewall import FIREWALL_KIND
from services.providers.cloud.pure.guard import PART_NAME as GUARD_PART
from services.providers.cloud.pure.userdata import PART_NAME as SQUID_PART
from services.providers.hetzner.provider import HetznerProvider
from services.providers.instrumented import instrument
from services.providers.squidauth.keyed import lease_auth_for, lease_keyed
from services.providers.squidauth.pure.cloudinit import PART_NAME as LEASE_PART
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.observability.metrics import Metrics
from services.testing.hetzner import HetznerFake
from tests.contract.provider import (
    closing,
    delete_all,
    owned,
)
from tests.support.executor_harness import declare
from tests.support.hetzner_support import CLIENTS, ENTRY, config, fake, request, user_data_parts
from tests.support.waiting import until

pytestmark = pytest.mark.integration
__all__ = ["fake"]  # a fixture

FIREWALL = "egress-proxies-hz-eu"
OWNER = "firewall:hz-eu"


@pytest.fixture
async def hz(fake: HetznerFake) -> AsyncIterator[HetznerProvider]:
    async with owned(HetznerProvider(ENTRY, config(fake))) as provider:
        yield provider


async def gone(provider: HetznerProvider, pid: str) -> None:
    """Delete the server and poll until Hetzner no longer has it."""
    await provider.delete(pid)

    async def absent() -> bool:
        try:
            await provider.get(pid)
        except NotFound:
            return True
        return False

    await until(absent, timeout=10.0, what=f"server {pid} gone")


def firewall(fake: HetznerFake) -> dict[str, Any]:
    found = fake.firewall_named(FIREWALL)
    assert found is not None, f"no firewall {FIREWALL}: {fake.firewalls}"
    return found


def applied(fake: HetznerFake) -> set[int]:
    return {int(a["server"]["id"]) for a in firewall(fake)["applied_to"]}


# ----------------------------------------------------------------------------- made, reused


async def test_made_once_with_exactly_the_allowed_clients_and_attached_at_create(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    first = await hz.create(request("px-1"))
    second = await hz.create(request("px-2"))
    assert fake.calls("firewall_create") == 1
    made = firewall(fake)
    assert made["labels"] == {"egress-proxies/managed": "true", "egress-proxies/provider": ENTRY}
    assert made["rules"] == [
        {
            "direction": "in",
            "protocol": "tcp",
            "port": "3128",
            "source_ips": list(CLIENTS),
            "destination_ips": [],
            "description": "egress-proxies: crawlers to Squid",
        }
    ]
    assert applied(fake) == {int(first), int(second)}
    assert {b["firewalls"][0]["firewall"] for b in fake.create_bodies} == {made["id"]}

    # another executor replica, or a restart
    async with closing(HetznerProvider(ENTRY, config(fake))) as replica:
        third = await replica.create(request("px-3"))
    assert fake.calls("firewall_create") == 1
    assert fake.calls("firewall_set_rules") == 0
    assert applied(fake) == {int(first), int(second), int(third)}


async def test_changed_allowed_clients_are_set_at_the_next_create(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    await hz.create(request("px-1"))
    widened = HetznerProvider(
        ENTRY, config(fake, allowed_clients=("198.51.100.0/24",), proxy_port=8080)
    )
    try:
        await widened.create(request("px-2"))
        await widened.create(request("px-3"))
    finally:
        await widened.close()
    assert fake.calls("firewall_set_rules") == 1
    (rule,) = firewall(fake)["rules"]
    assert (rule["port"], rule["source_ips"]) == ("8080", ["198.51.100.0/24"])


async def test_world_open_only_when_written(fake: HetznerFake) -> None:
    async with owned(
        HetznerProvider(ENTRY, config(fake, allowed_clients=("0.0.0.0/0", "::/0")))
    ) as provider:
        await provider.create(request("px-open"))
    (rule,) = firewall(fake)["rules"]
    assert rule["source_ips"] == ["0.0.0.0/0", "::/0"]


async def test_a_same_named_firewall_of_someone_else_is_neither_used_nor_changed(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    theirs = fake.put_firewall(FIREWALL, {"team": "search"})
    with pytest.raises(Permanent, match="without the labels of provider hz-eu"):
        await hz.create(request("px-1"))
    assert fake.servers == {}
    assert fake.firewalls[theirs]["rules"] == []
    assert await hz.leftovers() == []  # not reported: not ours to delete


# ----------------------------------------------------------------------------- leftover


async def test_a_leftover_only_when_no_server_is_left_then_deleted_and_made_again(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    pid = await hz.create(request("px-1"))
    made = firewall(fake)
    assert await hz.leftovers() == []
    fake.power_off(int(pid))
    assert await hz.leftovers() == []  # a stopped server still exists (and is billed)
    await hz.delete(pid)
    assert await hz.leftovers() == []  # deleting: still there
    await gone(hz, pid)
    (leftover,) = await hz.leftovers()
    assert leftover == Leftover(
        provider_id=f"firewalls/{made['id']}",
        owner_uid=OWNER,
        created_at=datetime.fromisoformat(str(made["created"])),
        kind=FIREWALL_KIND,
    )
    assert await hz.delete_leftover(leftover) is True
    assert fake.firewalls == {}
    assert await hz.delete_leftover(leftover) is True  # gone already: the goal is reached
    assert await hz.leftovers() == []

    again = await hz.create(request("px-2"))
    assert fake.calls("firewall_create") == 2
    assert applied(fake) == {int(again)}


async def test_a_firewall_a_server_came_back_to_is_kept(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    await gone(hz, await hz.create(request("px-1")))
    (leftover,) = await hz.leftovers()
    async with closing(HetznerProvider(ENTRY, config(fake))) as replica:
        await replica.create(request("px-2"))  # a create resumed between listing and delete
    assert await hz.delete_leftover(leftover) is False
    assert fake.firewall_named(FIREWALL) is not None
    # Hetzner's own guard: a firewall applied to a server is refused, and kept.
    await delete_all(hz)
    fake.inject(422, "resource_in_use", kind="firewall_delete")
    assert await hz.delete_leftover(leftover) is False


async def test_a_create_after_gc_deleted_the_firewall_makes_it_again(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    await gone(hz, await hz.create(request("px-1")))  # hz caches the firewall's id
    # the GC, in another process
    async with closing(HetznerProvider(ENTRY, config(fake))) as collector:
        (leftover,) = await collector.leftovers()
        assert await collector.delete_leftover(leftover) is True
    pid = await hz.create(request("px-2"))
    assert fake.calls("server_create") == 3  # refused once: the cached firewall is gone
    remade = firewall(fake)
    assert f"firewalls/{remade['id']}" != leftover.provider_id
    assert applied(fake) == {int(pid)}


async def test_delete_leftover_refuses_what_it_never_reports(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    theirs = fake.put_firewall("their-firewall", {"team": "search"})
    for provider_id, kind in (
        ("firewalls/x", FIREWALL_KIND),
        ("volumes/1", FIREWALL_KIND),
        (f"firewalls/{theirs}", "volume"),
        (f"firewalls/{theirs}", FIREWALL_KIND),
    ):
        with pytest.raises(Permanent):
            await hz.delete_leftover(Leftover(provider_id, OWNER, datetime.now(UTC), kind))
    assert theirs in fake.firewalls


async def test_a_failed_listing_fails_the_whole_leftover_call(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    fake.inject(503, "unavailable", kind="server_list")
    with pytest.raises(Transient):
        await hz.leftovers()
    fake.inject(500, "server_error", kind="firewall_list")
    with pytest.raises(Transient):
        await hz.leftovers()


# ----------------------------------------------------------------------------- GC


async def gc_round(
    conn: Connection, store: JetStreamEventStore, provider: HetznerProvider, metrics: Metrics
) -> None:
    collector = GarbageCollector(
        conn.js,
        store,
        {ENTRY: instrument(provider, metrics)},
        grace=0.0,
        lock=SweepLock(conn.js, ttl=30.0),
        registry=metrics.registry,
    )
    try:
        assert await collector.run_once() is not None
    finally:
        await collector.close()


async def test_gc_sweeps_orphan_servers_then_the_firewall_with_grace_and_dry_run(
    hz: HetznerProvider,
    fake: HetznerFake,
    conn: Connection,
    jetstream_store: JetStreamEventStore,
) -> None:
    await declare(jetstream_store, "live-1", ENTRY)
    live = await hz.create(request("px-live", owner_uid="live-1"))
    orphan = await hz.create(request("px-orphan", owner_uid="gone-1"))

    young = await sweep_once({ENTRY: hz}, {"live-1"}, datetime.now(UTC), 3600.0)
    assert (young.orphans, young.providers[0].young) == (0, 1)
    dry = await sweep_once({ENTRY: hz}, {"live-1"}, datetime.now(UTC), 0.0, dry_run=True)
    assert [i.provider_id for i in dry.providers[0].orphans] == [orphan]
    assert dry.deleted == 0
    assert int(orphan) in fake.servers

    metrics = Metrics()
    await gc_round(conn, jetstream_store, hz, metrics)
    assert fake.servers[int(orphan)].deleting
    assert not fake.servers[int(live)].deleting
    assert fake.firewall_named(FIREWALL) is not None  # a server is left

    # The proxy goes: its server is deleted (as the executor would), the firewall is left over.
    await gone(hz, live)
    await gone(hz, orphan)
    young = await sweep_once({ENTRY: hz}, set(), datetime.now(UTC), 3600.0)
    left = young.providers[0].leftovers
    assert left is not None
    assert (left.listed, left.young, left.orphans) == (1, 1, [])
    dry = await sweep_once({ENTRY: hz}, set(), datetime.now(UTC), 0.0, dry_run=True)
    assert dry.providers[0].leftovers is not None
    assert [o.kind for o in dry.providers[0].leftovers.orphans] == [FIREWALL_KIND]
    assert fake.firewall_named(FIREWALL) is not None

    await gc_round(conn, jetstream_store, hz, metrics)
    assert fake.firewalls == {}
    events = list((await jetstream_store.read(subjects.gc(ENTRY))).decoded())
    found = [(e.kind, e.owner_uid, e.provider_id) for e in events if isinstance(e, OrphanFound)]
    assert found == [
        ("instance", "gone-1", orphan),
        (FIREWALL_KIND, OWNER, dry.providers[0].leftovers.orphans[0].provider_id),
    ]
    deleted = [e for e in events if isinstance(e, OrphanDeleted)]
    assert [e.ok for e in deleted] == [True, True]
    assert len([e for e in events if isinstance(e, SweepCompleted)]) == 2
    sample = metrics.registry.get_sample_value
    labels = {"provider": ENTRY, "kind": FIREWALL_KIND, "result": "ok"}
    assert sample("egress_gc_leftover_deletes_total", labels) == 1.0


# ----------------------------------------------------------------------------- user data


async def test_user_data_has_the_proxys_part_the_squid_part_and_the_lease_part(
    fake: HetznerFake,
) -> None:
    master = b"m" * 32
    provider = HetznerProvider(ENTRY, config(fake))
    wrapped = lease_keyed(provider, master)
    assert isinstance(wrapped, LeftoverCleaner)
    try:
        await wrapped.create(request("px-lease", owner_uid="uid-7", cloud_init="#cloud-config\n"))
    finally:
        await delete_all(provider)
        await wrapped.close()
    (body,) = fake.create_bodies
    parts = user_data_parts(body["user_data"])
    # cloud-init runs script parts in name order: the metadata guard (D134), Squid's
    # configuration, then the lease's.
    assert sorted(parts) == ["part-001", GUARD_PART, SQUID_PART, LEASE_PART]
    assert parts["part-001"] == "#cloud-config\n"
    assert "apt-get install -y -q squid" in parts[SQUID_PART]
    assert lease_auth_for(master, "uid-7").key in parts[LEASE_PART]
