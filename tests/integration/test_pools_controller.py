"""The pool controller on a real nats-server with the reconciler and the executor: members are
Proxies that go Ready, a scale adds and retires exactly what it should, two controller replicas
never make a member twice, spread follows the weights and leaves a failing provider, and a
pool deleted takes its members with it."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime

import pytest

from commands.declaring import Declaration, apply
from events import subjects
from events.customresource import cli_uid
from events.pool import PoolDeclared, PoolDeletionRequested, PoolScaled, PoolSpec, SpreadEntry
from events.poolresource import POOL_ATTRIBUTE, member_name, pool_uid
from events.schemas import Phase, ProxySpec
from events.store import NewEvent, derive_msg_id
from projections import pool as pool_fold
from projections.pool import PoolView
from projections.proxy import ProxyView
from services.pools.controller import Controller
from services.pools.service import PoolsService
from services.providers.base import Permanent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.testing.provider import FakeProvider
from tests.support.lifecycle import fleet, start, view
from tests.support.waiting import until

pytestmark = pytest.mark.integration

NS = "crawl"


async def declare(store: JetStreamEventStore, name: str, spec: PoolSpec) -> str:
    uid = pool_uid(NS, name)
    event = PoolDeclared(uid=uid, namespace=NS, name=name, spec=spec)
    await store.append(subjects.pool(uid), [NewEvent(event, derive_msg_id(uid, "d"))], 0)
    return uid


async def pool_event(store: JetStreamEventStore, uid: str, event: object, what: str) -> None:
    history = await store.read(subjects.pool(uid))
    new = NewEvent(event, derive_msg_id(uid, what))  # type: ignore[arg-type]
    await store.append(subjects.pool(uid), [new], history.last_seq)


async def pool_view(store: JetStreamEventStore, uid: str) -> PoolView:
    found = pool_fold.fold(list((await store.read(subjects.pool(uid))).events))
    assert found is not None
    return found


async def members(store: JetStreamEventStore, uid: str) -> dict[str, ProxyView]:
    """The pool's planned members that exist as Proxies (declared, not removed)."""
    pool = await pool_view(store, uid)
    out = {}
    for planned in pool.members.values():
        found = await view(store, planned.member.uid)
        if found is not None and not found.removed:
            out[planned.member.uid] = found
    return out


async def ready_members(store: JetStreamEventStore, uid: str, count: int) -> dict[str, ProxyView]:
    got: dict[str, ProxyView] = {}

    async def settled() -> bool:
        nonlocal got
        got = await members(store, uid)
        pool = await pool_view(store, uid)
        return (
            len(got) == count
            and len(pool.active()) == count
            and all(v.phase is Phase.READY and not v.deleting for v in got.values())
        )

    await until(settled, timeout=30.0, what=f"{count} Ready members")
    return got


def spec(replicas: int, **more: object) -> PoolSpec:
    template = ProxySpec(provider="fake", attributes={"country": "de"})
    return PoolSpec(replicas=replicas, template=template, **more)  # type: ignore[arg-type]


async def test_a_pool_scales_3_8_2_with_ready_members_named_and_labelled(
    nats_server: object, jetstream_store: JetStreamEventStore
) -> None:
    url = nats_server.url  # type: ignore[attr-defined]
    fake = FakeProvider("fake")
    async with fleet(url, {"fake": fake}) as tasks:
        await start(url, PoolsService(interval=0.1), tasks)
        uid = await declare(jetstream_store, "de", spec(3))
        got = await ready_members(jetstream_store, uid, 3)
        for member in got.values():
            assert member.name.startswith("de-")
            assert len(member.name) == len("de-") + 5
            assert member.namespace == NS
            assert member.spec.attributes == {"country": "de", POOL_ATTRIBUTE: "de"}
            assert member.source == f"pool/{NS}/de"

        await pool_event(jetstream_store, uid, PoolScaled(uid=uid, replicas=8), "s8")
        await ready_members(jetstream_store, uid, 8)
        await pool_event(jetstream_store, uid, PoolScaled(uid=uid, replicas=2), "s2")
        kept = await ready_members(jetstream_store, uid, 2)

        async def instances_follow() -> bool:
            return len(fake.instances) == 2

        await until(instances_follow, timeout=30.0, what="retired members' instances deleted")
    pool = await pool_view(jetstream_store, uid)
    assert len(pool.members) == 8
    assert {p.member.uid for p in pool.active()} == set(kept)
    reasons = [d for d in (pool.last_decision,) if d is not None]
    assert reasons
    assert reasons[0].reason == "ScaleDown"
    assert reasons[0].figures.desired == 2


async def test_two_controllers_never_make_a_member_twice(
    nats_server: object, jetstream_store: JetStreamEventStore
) -> None:
    url = nats_server.url  # type: ignore[attr-defined]
    fake = FakeProvider("fake")
    async with fleet(url, {"fake": fake}) as tasks:
        await start(url, PoolsService(interval=0.05), tasks)
        await start(url, PoolsService(interval=0.05), tasks)
        uid = await declare(jetstream_store, "twin", spec(6))
        await ready_members(jetstream_store, uid, 6)
        await pool_event(jetstream_store, uid, PoolScaled(uid=uid, replicas=12), "s12")
        await ready_members(jetstream_store, uid, 12)
    pool = await pool_view(jetstream_store, uid)
    assert len(pool.members) == 12  # planned once each, though both replicas decided
    assert pool.next_ordinal == 12
    assert fake.created_total == 12
    assert max(fake.max_live_per_owner.values()) == 1


async def test_spread_follows_the_weights_and_leaves_a_provider_that_fails(
    nats_server: object, jetstream_store: JetStreamEventStore
) -> None:
    url = nats_server.url  # type: ignore[attr-defined]
    eu, home = FakeProvider("eu"), FakeProvider("home")
    async with fleet(url, {"eu": eu, "home": home}) as tasks:
        await start(url, PoolsService(interval=0.1), tasks)
        spread = (SpreadEntry(provider="eu", weight=2), SpreadEntry(provider="home", weight=1))
        template = ProxySpec(attributes={"country": "de"})
        uid = await declare(
            jetstream_store, "wide", PoolSpec(replicas=9, template=template, spread=spread)
        )
        got = await ready_members(jetstream_store, uid, 9)
        assert Counter(v.spec.provider for v in got.values()) == {"eu": 6, "home": 3}

        # Every create on home now fails for good: the members it is asked for are Failed,
        # retired, and placed on eu instead.
        home.inject("create", Permanent("quota exhausted for good"), times=1000)
        await pool_event(jetstream_store, uid, PoolScaled(uid=uid, replicas=12), "s12")
        got = await ready_members(jetstream_store, uid, 12)
        placed = Counter(v.spec.provider for v in got.values())
        assert placed["home"] == 3  # the ones that ran before are kept
        assert placed["eu"] == 9
        pool = await pool_view(jetstream_store, uid)
        assert "home" in pool.failing(datetime.now(UTC))
        failed = [p for p in pool.retired() if p.member.provider == "home"]
        assert failed, "a member Failed on home was retired"


async def test_a_deleted_pool_takes_its_members_and_ends(
    nats_server: object, jetstream_store: JetStreamEventStore
) -> None:
    url = nats_server.url  # type: ignore[attr-defined]
    fake = FakeProvider("fake")
    async with fleet(url, {"fake": fake}) as tasks:
        await start(url, PoolsService(interval=0.1), tasks)
        uid = await declare(jetstream_store, "gone", spec(4))
        await ready_members(jetstream_store, uid, 4)
        await pool_event(jetstream_store, uid, PoolDeletionRequested(uid=uid), "delete")

        async def removed() -> bool:
            return (await pool_view(jetstream_store, uid)).removed

        await until(removed, timeout=30.0, what="PoolRemoved")
        assert fake.instances == {}
    history = await jetstream_store.read(subjects.pool(uid))
    assert type(history.events[-1].event).__name__ == "PoolRemoved"
    await asyncio.sleep(0)


async def test_a_proxy_someone_else_declared_under_a_members_name_is_not_taken_over(
    nats_server: object,
    jetstream_store: JetStreamEventStore,
    captured_logs: pytest.CaptureFixture[str],
) -> None:
    """Another party's Proxy that happens to hold a member's name (and so its uid) keeps its
    spec and its source: the pool refuses it and stays short, nothing of it changed."""
    url = nats_server.url  # type: ignore[attr-defined]
    uid = pool_uid(NS, "taken")
    squatted = member_name("taken", uid, 0)
    mine = ProxySpec(provider="fake", attributes={"owner": "someone"})
    await apply(
        jetstream_store,
        Declaration(uid=cli_uid(NS, squatted), namespace=NS, name=squatted, spec=mine),
    )
    fake = FakeProvider("fake")
    async with fleet(url, {"fake": fake}) as tasks:
        await start(url, PoolsService(interval=0.05), tasks)
        await declare(jetstream_store, "taken", spec(2))

        async def planned() -> bool:
            pool = await pool_view(jetstream_store, uid)
            return len(pool.active()) == 2 and len(await members(jetstream_store, uid)) == 2

        await until(planned, timeout=30.0, what="both members planned")
        logged: list[str] = []

        def refused_again() -> bool:  # each evaluation over the squatted name says so
            logged.append(captured_logs.readouterr().out)
            return "".join(logged).count("does not own; not taken over") >= 5

        await until(refused_again, timeout=30, what="five evaluations over the squatted name")
    theirs = await view(jetstream_store, cli_uid(NS, squatted))
    assert theirs is not None
    assert (theirs.source, theirs.spec, theirs.generation) == ("cli", mine, 1)


async def test_one_evaluation_plans_and_declares_a_growing_pool_in_bounded_decisions(
    jetstream_store: JetStreamEventStore,
) -> None:
    """250 members: three decisions of at most 100 recorded in one evaluation, then every
    member declared (concurrently), so the pool does not grow by 100 per tick."""
    uid = await declare(jetstream_store, "big", spec(250))
    pool = await pool_view(jetstream_store, uid)
    outcome = await Controller(jetstream_store).evaluate(pool, {}, {}, datetime.now(UTC))
    assert len(outcome.declared) == 250
    after = await pool_view(jetstream_store, uid)
    assert after.decisions == 3
    assert len(after.active()) == 250
    assert not outcome.more  # the last decision added 50: nothing left to plan
    for planned in after.active()[:5]:
        declared = await view(jetstream_store, planned.member.uid)
        assert declared is not None
        assert declared.spec.attributes[POOL_ATTRIBUTE] == "big"
