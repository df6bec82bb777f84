"""The digitalocean provider's cloud firewall against the local fake: made once before the first
droplet with exactly ``allowedClients`` on ``proxyPort``, shared, put right when the settings
change, made again when it vanishes, a GC leftover only once the entry has no droplet; and the
orphan sweep through the real GC code (dry run, grace, events) with a real nats-server."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from events import subjects
from events.schemas import Event, OrphanDeleted, OrphanFound
from services.gc.collector import GarbageCollector
from services.gc.lock import SweepLock
from services.gc.sweep import sweep_once
from services.providers.base import Leftover, LeftoverCleaner, Permanent
from services.providers.cloud.pure.firewall import FIREWALL_KIND, firewall_owner
from services.providers.digitalocean.provider import DigitalOceanProvider
from services.providers.instrumented import instrument
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.observability.metrics import Metrics
from services.testing.digitalocean import DigitalOceanFake
from tests.contract.provider import closing
from tests.support.digitalocean_support import CLIENTS, ENTRY, do, fake, provider, request
from tests.support.executor_harness import declare
from tests.support.waiting import until

pytestmark = pytest.mark.integration
__all__ = ["do", "fake"]  # fixtures

PROVIDER_TAG = "egress-proxies-provider:do-ams"
WORLD = ["0.0.0.0/0", "::/0"]


def the_firewall(fake: DigitalOceanFake) -> dict[str, object]:
    (firewall,) = fake.firewalls.values()
    return firewall


async def test_one_firewall_opens_the_port_to_the_clients_only_and_is_shared(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    assert isinstance(do, LeftoverCleaner)
    await do.create(request("px-a"))
    await do.create(request("px-b", owner_uid="owner-2"))
    firewall = the_firewall(fake)
    assert fake.calls_of("firewalls.create") == 1
    assert firewall["name"] == "egress-proxies-do-ams"
    assert firewall["tags"] == [PROVIDER_TAG]  # every droplet of the entry, from its first moment
    assert firewall["inbound_rules"] == [
        {"protocol": "tcp", "ports": "3128", "sources": {"addresses": list(CLIENTS)}}
    ]
    outbound = firewall["outbound_rules"]
    assert isinstance(outbound, list)
    assert {r["protocol"] for r in outbound} == {"tcp", "udp", "icmp"}
    assert all(r["destinations"]["addresses"] == WORLD for r in outbound)
    # The firewall came before any droplet: its tag had to be made first.
    order = [c for c in fake.calls if c in ("tags.create", "firewalls.create", "droplets.create")]
    assert order[:3] == ["tags.create", "firewalls.create", "droplets.create"]


async def test_changed_settings_are_put_right_at_the_next_create(fake: DigitalOceanFake) -> None:
    first = provider(fake)
    await first.create(request("px-a"))
    firewall_id = the_firewall(fake)["id"]
    await first.close()
    async with closing(
        provider(fake, allowed_clients=("192.0.2.0/24",), proxy_port=8888)
    ) as changed:
        await changed.create(request("px-b"))
        await changed.create(request("px-c"))
    firewall = the_firewall(fake)
    assert firewall["id"] == firewall_id
    assert fake.calls_of("firewalls.update") == 1
    assert firewall["inbound_rules"] == [
        {"protocol": "tcp", "ports": "8888", "sources": {"addresses": ["192.0.2.0/24"]}}
    ]


async def test_a_firewall_deleted_behind_the_providers_back_is_made_again(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    await do.create(request("px-a"))
    fake.delete_firewall(str(the_firewall(fake)["id"]))
    await do.create(request("px-b"))
    assert the_firewall(fake)["tags"] == [PROVIDER_TAG]
    assert fake.calls_of("firewalls.create") == 2


async def test_a_firewall_deleted_while_the_droplet_is_made_is_made_again_after_it(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    """GC's delete can land between the provider's look at the firewall and its droplet: the
    look after the droplet finds it gone and makes it again, so no droplet stays world-open."""
    await do.create(request("px-a"))
    firewall_id = str(the_firewall(fake)["id"])
    fake.stall("droplets.create", 1.0)
    creating = asyncio.create_task(do.create(request("px-b")))
    await until(
        lambda: fake.calls_of("droplets.create") == 2, timeout=10.0, what="the second create"
    )
    fake.delete_firewall(firewall_id)
    await creating
    assert the_firewall(fake)["id"] != firewall_id
    assert len(fake.droplets) == 2


async def test_the_firewall_is_a_leftover_only_once_no_droplet_is_left(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    a = await do.create(request("px-a"))
    b = await do.create(request("px-b"))
    assert await do.leftovers() == []
    await do.delete(a)
    fake.power_off(int(b))
    assert await do.leftovers() == []  # a stopped droplet still needs its firewall
    await do.delete(b)
    (leftover,) = await do.leftovers()
    firewall = the_firewall(fake)
    assert leftover.provider_id == f"firewalls/{firewall['id']}"
    assert (leftover.kind, leftover.owner_uid) == (FIREWALL_KIND, firewall_owner(ENTRY))
    assert leftover.created_at.tzinfo is not None
    assert await do.delete_leftover(leftover)
    assert fake.firewalls == {}
    assert await do.delete_leftover(leftover)  # gone already: the goal is reached
    await do.create(request("px-c"))
    assert the_firewall(fake)["inbound_rules"]
    assert fake.calls_of("tags.create") == 1  # the tag outlives the firewall: looked up, kept


async def test_a_firewall_in_use_again_is_kept(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    await do.delete(await do.create(request("px-a")))
    (leftover,) = await do.leftovers()
    await do.create(request("px-b"))  # a create resumed between GC's listing and its delete
    assert not await do.delete_leftover(leftover)
    assert len(fake.firewalls) == 1


async def test_only_this_entrys_firewalls_are_ever_deleted(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    async with closing(provider(fake, "do-fra")) as other:
        await other.create(request("px-fra"))
    (foreign,) = fake.firewalls
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for bad in (
        Leftover(f"firewalls/{foreign}", firewall_owner(ENTRY), epoch, FIREWALL_KIND),
        Leftover(f"firewalls/{foreign}", firewall_owner(ENTRY), epoch, "volume"),
        Leftover(foreign, firewall_owner(ENTRY), epoch, FIREWALL_KIND),
        Leftover("firewalls/../droplets/1", firewall_owner(ENTRY), epoch, FIREWALL_KIND),
    ):
        with pytest.raises(Permanent):
            await do.delete_leftover(bad)
    assert list(fake.firewalls) == [foreign]
    assert await do.leftovers() == []  # the other entry's firewall is not ours to report


# ----------------------------------------------------------------------------- GC


async def gc_events(store: JetStreamEventStore) -> list[Event]:
    return list((await store.read(subjects.gc(ENTRY))).decoded())


async def test_gc_deletes_orphan_droplets_then_the_firewall(
    do: DigitalOceanProvider,
    fake: DigitalOceanFake,
    conn: Connection,
    jetstream_store: JetStreamEventStore,
) -> None:
    await declare(jetstream_store, "live", ENTRY)
    live = await do.create(request("px-live", owner_uid="live"))
    gone = await do.create(request("px-gone", owner_uid="gone"))

    # Within the grace (a create in flight looks exactly like this): nothing is touched.
    young = await sweep_once({ENTRY: do}, {"live"}, datetime.now(UTC), 3600.0)
    assert (young.providers[0].young, young.deleted) == (1, 0)

    metrics = Metrics()
    gcol = GarbageCollector(
        conn.js,
        jetstream_store,
        {ENTRY: instrument(do, metrics)},
        grace=0.0,
        lock=SweepLock(conn.js, ttl=30.0),
        registry=metrics.registry,
    )
    try:
        dry = await gcol.run_once(dry_run=True)
        assert dry is not None
        assert [i.provider_id for i in dry.providers[0].orphans] == [gone]
        assert set(fake.droplets) == {int(live), int(gone)}  # a dry run deletes nothing

        swept = await gcol.run_once()
        assert swept is not None
        assert swept.providers[0].deleted == [gone]
        assert set(fake.droplets) == {int(live)}
        assert swept.leftovers == 0  # the live proxy's droplet still needs the firewall
        assert len(fake.firewalls) == 1

        await do.delete(live)  # the proxy is deleted; its droplet with it
        last = await gcol.run_once()
    finally:
        await gcol.close()
    assert last is not None
    assert last.leftovers_deleted == 1
    assert fake.firewalls == {}
    events = await gc_events(jetstream_store)
    found = {e.provider_id: e.kind for e in events if isinstance(e, OrphanFound)}
    firewall_ids = [pid for pid, kind in found.items() if kind == FIREWALL_KIND]
    assert len(firewall_ids) == 1
    assert found[gone] != FIREWALL_KIND
    deleted = {e.provider_id for e in events if isinstance(e, OrphanDeleted) and e.ok}
    assert deleted == {gone, firewall_ids[0]}
