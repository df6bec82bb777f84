"""The reconciler's side of a lease switch (``services.reconciler.leases``), on the in-memory
event store, which keeps the JetStream store's contract
(docs/decisions/0085-a-fresh-ip-without-downtime.md)."""

from __future__ import annotations

from events import subjects
from events.schemas import LeaseAcquired, LeaseReleased, LeaseSwitched
from events.store import NewEvent
from projections import lease
from services.reconciler.leases import is_leased, switch_lease
from services.testing.eventlog import InMemoryEventStore

UID = "p1"


async def claimed(store: InMemoryEventStore) -> None:
    claim = LeaseAcquired(lease_id="l1", proxy_uid=UID, ttl_seconds=60)
    await store.append(subjects.lease(UID), [NewEvent(claim, "claim")], expected_seq=0)


async def view(store: InMemoryEventStore) -> lease.LeaseView:
    folded = lease.fold(list((await store.read(subjects.lease(UID))).events))
    assert folded is not None
    return folded


async def test_a_free_proxy_has_no_lease_to_switch() -> None:
    store = InMemoryEventStore()
    assert not await is_leased(store, UID)
    assert not await switch_lease(store, UID, "rot-1", "new", "10.0.0.2")
    assert (await store.read(subjects.lease(UID))).events == []


async def test_the_current_lease_is_switched_once_per_rotation() -> None:
    store = InMemoryEventStore()
    await claimed(store)
    assert await is_leased(store, UID)
    before = (await view(store)).fencing_token
    assert await switch_lease(store, UID, "rot-1", "new", "10.0.0.2")
    assert not await switch_lease(store, UID, "rot-1", "new", "10.0.0.2")  # a redelivery
    history = (await store.read(subjects.lease(UID))).events
    assert [type(r.event) for r in history] == [LeaseAcquired, LeaseSwitched]
    after = await view(store)
    assert after.current is not None
    assert (after.current.provider_id, after.current.rotation_id) == ("new", "rot-1")
    assert after.fencing_token == history[-1].seq > before
    assert await switch_lease(store, UID, "rot-2", "newer", "10.0.0.3")  # the next rotation
    assert (await view(store)).fencing_token > after.fencing_token


async def test_a_released_lease_is_not_switched() -> None:
    store = InMemoryEventStore()
    await claimed(store)
    released = LeaseReleased(lease_id="l1", proxy_uid=UID)
    await store.append(subjects.lease(UID), [NewEvent(released, "release")])
    assert not await is_leased(store, UID)
    assert not await switch_lease(store, UID, "rot-1", "new", "10.0.0.2")
