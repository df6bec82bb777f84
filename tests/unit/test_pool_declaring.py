"""Applying, scaling and deleting pools on the in-memory store: what lands on the pool's
aggregate, and what is left alone."""

from __future__ import annotations

import msgspec
import pytest

from commands.pooldeclaring import ReplicasOutOfRange, apply_pool, delete_pool, scale_pool
from events import subjects
from events.pool import (
    MAX_REPLICAS,
    PoolDeclared,
    PoolDeletionRequested,
    PoolRemoved,
    PoolScaled,
    PoolSpec,
    PoolSpecChanged,
)
from events.poolresource import pool_uid
from events.spec import ProxySpec
from events.store import NewEvent
from projections.pool import fold
from services.runtime.eventlog.memory import InMemoryEventStore

SPEC = PoolSpec(replicas=3, template=ProxySpec(provider="local", attributes={"country": "de"}))


async def events(store: InMemoryEventStore, name: str = "de") -> list[object]:
    read = await store.read(subjects.pool(pool_uid("crawl", name)))
    return [r.event for r in read.events]


async def test_apply_declares_once_then_changes_with_the_next_generation() -> None:
    store = InMemoryEventStore()
    first = await apply_pool(store, "crawl", "de", SPEC)
    assert (first.result, first.uid) == ("created", pool_uid("crawl", "de"))
    assert (await apply_pool(store, "crawl", "de", SPEC)).result == "unchanged"
    bigger = msgspec.structs.replace(SPEC, replicas=5, max_age_seconds=3600.0)
    assert (await apply_pool(store, "crawl", "de", bigger)).result == "changed"
    assert (await apply_pool(store, "crawl", "de", bigger)).result == "unchanged"
    declared, changed = await events(store)
    assert isinstance(declared, PoolDeclared)
    assert (declared.namespace, declared.name, declared.generation) == ("crawl", "de", 1)
    assert declared.source == "cli"
    assert isinstance(changed, PoolSpecChanged)
    assert (changed.generation, changed.spec) == (2, bigger)


async def test_a_scale_outlives_an_apply_of_the_same_spec_but_not_a_changed_one() -> None:
    store = InMemoryEventStore()
    await apply_pool(store, "crawl", "de", SPEC)
    assert (await scale_pool(store, "crawl", "de", 7)).result == "scaled"
    assert (await scale_pool(store, "crawl", "de", 7)).result == "unchanged"
    assert (await apply_pool(store, "crawl", "de", SPEC)).result == "unchanged"
    uid = pool_uid("crawl", "de")
    view = fold((await store.read(subjects.pool(uid))).events)
    assert view is not None
    assert view.replicas == 7
    four = msgspec.structs.replace(SPEC, replicas=4)
    assert (await apply_pool(store, "crawl", "de", four)).result == "changed"
    view = fold((await store.read(subjects.pool(uid))).events)
    assert view is not None
    assert view.replicas == 4
    assert [type(e) for e in await events(store)] == [PoolDeclared, PoolScaled, PoolSpecChanged]


@pytest.mark.parametrize("replicas", [-1, MAX_REPLICAS + 1])
async def test_a_scale_out_of_bounds_is_refused_before_anything_is_appended(
    replicas: int,
) -> None:
    store = InMemoryEventStore()
    await apply_pool(store, "crawl", "de", SPEC)
    with pytest.raises(ReplicasOutOfRange, match=f"replicas: {replicas} is out of range"):
        await scale_pool(store, "crawl", "de", replicas)
    assert [type(e) for e in await events(store)] == [PoolDeclared]
    assert (await scale_pool(store, "crawl", "de", MAX_REPLICAS)).result == "scaled"
    assert (await scale_pool(store, "crawl", "de", 0)).result == "scaled"


async def test_scale_and_delete_of_no_pool_are_absent_and_append_nothing() -> None:
    store = InMemoryEventStore()
    assert (await scale_pool(store, "crawl", "nope", 2)).result == "absent"
    assert (await delete_pool(store, "crawl", "nope")).result == "absent"
    assert await events(store, "nope") == []


async def test_a_pool_being_deleted_is_neither_scaled_nor_changed_until_removed() -> None:
    store = InMemoryEventStore()
    await apply_pool(store, "crawl", "de", SPEC)
    assert (await delete_pool(store, "crawl", "de")).result == "deleted"
    assert (await delete_pool(store, "crawl", "de")).result == "deleting"
    assert (await scale_pool(store, "crawl", "de", 9)).result == "deleting"
    changed = msgspec.structs.replace(SPEC, replicas=1)
    assert (await apply_pool(store, "crawl", "de", changed)).result == "deleting"
    assert [type(e) for e in await events(store)] == [PoolDeclared, PoolDeletionRequested]
    uid = pool_uid("crawl", "de")
    await store.append(subjects.pool(uid), [NewEvent(PoolRemoved(uid=uid), "removed")])
    assert (await scale_pool(store, "crawl", "de", 2)).result == "absent"
    again = await apply_pool(store, "crawl", "de", changed)
    assert (again.result, again.uid) == ("created", uid)
    last = (await events(store))[-1]
    assert isinstance(last, PoolDeclared)
    assert last.generation == 2  # after the removed pool's, so an observer sees it is new
