"""The pool controller killed with SIGKILL in the middle of a scale: after a restart the pool has
exactly the members it asks for, each planned once and each a Proxy, none made twice."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable

import pytest
from nats.aio.msg import Msg

from events import subjects
from events.pool import PoolDeclared, PoolScaled, PoolSpec
from events.poolresource import pool_uid
from events.schemas import ProxySpec
from events.store import NewEvent, derive_msg_id
from projections import pool as pool_fold
from projections.pool import PoolView
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from services.testing.provider import FakeProvider
from tests.support.cli_process import ROOT, clean_env
from tests.support.lifecycle import fleet, view
from tests.support.waiting import until

pytestmark = pytest.mark.reliability


async def pool_view(store: JetStreamEventStore, uid: str) -> PoolView:
    found = pool_fold.fold(list((await store.read(subjects.pool(uid))).events))
    assert found is not None
    return found


async def controller(url: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.cli.main",
        "run",
        "pools",
        "--nats-url",
        url,
        "--pool-interval",
        "0.05",
        "--metrics-port",
        "0",
        cwd=ROOT,
        env=clean_env(),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def test_a_controller_killed_mid_scale_leaves_exactly_the_desired_members(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    uid = pool_uid("crawl", "kill")
    spec = PoolSpec(replicas=0, template=ProxySpec(provider="fake"))
    declared = PoolDeclared(uid=uid, namespace="crawl", name="kill", spec=spec)
    await jetstream_store.append(subjects.pool(uid), [NewEvent(declared, "d")], 0)
    fake = FakeProvider("fake")
    url = nats_server.url_for("pools")
    kills = unfinished = 0
    async with fleet(nats_server.url, {"fake": fake}):
        for round_, replicas in enumerate((40, 15, 55, 30)):
            history = await jetstream_store.read(subjects.pool(uid))
            scaled = NewEvent(
                PoolScaled(uid=uid, replicas=replicas), derive_msg_id(uid, str(round_))
            )
            await jetstream_store.append(subjects.pool(uid), [scaled], history.last_seq)
            # Killed the moment its decision is stored: before it has declared (or deleted) the
            # members it decided on, which only the next controller's evaluations can finish.
            decided = asyncio.get_running_loop().create_future()
            sub = await conn.nc.subscribe(f"pool.{uid}.decision", cb=_setter(decided))
            process = await controller(url)
            await asyncio.wait_for(decided, 30.0)
            process.send_signal(signal.SIGKILL)
            await process.wait()
            await sub.unsubscribe()
            kills += 1
            unfinished += await _unfinished(jetstream_store, uid)
        survivor = await controller(url)
        try:

            async def settled() -> bool:
                pool = await pool_view(jetstream_store, uid)
                if len(pool.active()) != 30:
                    return False
                for planned in pool.members.values():
                    proxy = await view(jetstream_store, planned.member.uid)
                    exists = proxy is not None and not proxy.removed and not proxy.deleting
                    if exists != (planned.retired_at is None):
                        return False
                return len(fake.instances) == 30

            await until(settled, timeout=60.0, what="exactly 30 members after the kills")
        finally:
            survivor.send_signal(signal.SIGKILL)
            await survivor.wait()
    pool = await pool_view(jetstream_store, uid)
    ordinals = sorted(p.member.ordinal for p in pool.members.values())
    assert ordinals == list(range(len(ordinals)))  # each planned once
    assert max(fake.max_live_per_owner.values()) == 1  # no member made twice
    assert kills == 4
    assert unfinished > 0, "no kill landed between a decision and its declarations"


def _setter(future: asyncio.Future[None]) -> Callable[[Msg], Awaitable[None]]:
    async def set_(msg: Msg) -> None:
        if not future.done():
            future.set_result(None)

    return set_


async def _unfinished(store: JetStreamEventStore, uid: str) -> int:
    """Members whose Proxy does not yet agree with the pool: planned without one, or retired
    with one still there."""
    pool = await pool_view(store, uid)
    count = 0
    for planned in pool.members.values():
        proxy = await view(store, planned.member.uid)
        exists = proxy is not None and not proxy.removed and not proxy.deleting
        count += exists != (planned.retired_at is None)
    return count
