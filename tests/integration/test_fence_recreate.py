"""Fencing survives the re-creation of a proxy's instance
(docs/decisions/0092-nobody-who-reaches-a-proxy.md).

The real executor (its consumer loop, on a real nats-server) creates the instances through the
local provider, keyed as in production, so each is a real Squid running the real helper; the
leases are real events on ``lease.<uid>``, their tokens the fold's. Holder A is fenced by B on
the first instance; the first instance's Squid dies and a second instance is created for the
proxy: A's credential is refused there from its very first request, and B is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import uuid

import pytest

from events import subjects
from events.schemas import InstanceObserved, InstanceState, LeaseAcquired, LeaseReleased
from events.store import EventStore, NewEvent
from projections.commands import Answer
from projections.lease import fold
from services.providers import local_process
from services.providers.local import LocalProvider
from services.providers.squidauth.keyed import lease_keyed
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from tests.integration.test_proxy_auth import (
    MASTER,
    Proxy,
    lease,
    refused_after,
    start,
    status_via,
)
from tests.support.executor_harness import answers, count, create, declare, executor, send
from tests.support.squid_fixtures import local_squids, origin_url  # noqa: F401  # fixtures `local` and `target`
from tests.support.system import processes_mentioning
from tests.support.waiting import until

pytestmark = pytest.mark.integration


async def lease_event(store: EventStore, uid: str, event: LeaseAcquired | LeaseReleased) -> int:
    """Append ``event`` to the proxy's lease stream; the proxy's fencing token after it."""
    news = [NewEvent(event, f"{uid}-{type(event).__name__}-{event.lease_id}")]
    await store.append(subjects.lease(uid), news)
    view = fold((await store.read(subjects.lease(uid))).events)
    assert view is not None
    return view.fencing_token


async def running_instance(store: EventStore, uid: str, local: LocalProvider, n: int) -> Proxy:
    """The ``n``-th instance the executor saw Running for the proxy."""

    async def observed() -> bool:
        return await count(store, uid, InstanceObserved, n)

    await until(observed, 60, what=f"instance {n} observed")
    seen = [a for a in await answers(store, uid) if isinstance(a, InstanceObserved)]
    latest: Answer = seen[n - 1]
    assert isinstance(latest, InstanceObserved)
    assert latest.state is InstanceState.RUNNING, latest
    return Proxy(uid, latest.url, local.data_dir / "instances" / latest.provider_id)


async def test_a_fenced_holder_stays_fenced_on_the_proxys_next_instance(
    conn: Connection, jetstream_store: JetStreamEventStore, local: LocalProvider, target: str
) -> None:
    store, uid = jetstream_store, str(uuid.uuid4())
    await declare(store, uid)
    token_a = await lease_event(
        store, uid, LeaseAcquired(lease_id="a", proxy_uid=uid, ttl_seconds=300)
    )
    async with executor(conn, store, {"local": lease_keyed(local, MASTER)}):
        await send(store, uid, create("c1", provider="local"))
        first = await running_instance(store, uid, local, 1)
        holder_a = lease(first, token_a, 300)
        assert await asyncio.to_thread(status_via, holder_a, target) == 200

        await lease_event(store, uid, LeaseReleased(lease_id="a", proxy_uid=uid))
        token_b = await lease_event(
            store, uid, LeaseAcquired(lease_id="b", proxy_uid=uid, ttl_seconds=300)
        )
        assert token_b > token_a
        holder_b = lease(first, token_b, 300)
        assert await asyncio.to_thread(status_via, holder_b, target) == 200
        assert await refused_after(holder_a, target) < 2.0

        # The first instance's Squid dies; the proxy gets a new instance.
        os.killpg(local_process.read_pid(first.instance_dir), signal.SIGKILL)
        await send(store, uid, create("c2", provider="local"))
        second = await running_instance(store, uid, local, 2)
        assert second.instance_dir != first.instance_dir

    again_a = lease(second, token_a, 300)
    again_b = lease(second, token_b, 300)
    assert await asyncio.to_thread(status_via, again_a, target) == 407  # its very first request
    assert await asyncio.to_thread(status_via, again_b, target) == 200
    assert await asyncio.to_thread(status_via, again_a, target) == 407


async def test_a_new_instance_never_inherits_the_fencing_state_of_a_former_one_at_its_path(
    local: LocalProvider, target: str
) -> None:
    """A data dir wiped by hand leaves behind what lived outside it: the helper's own directory
    in the temporary directory, when Squid's user cannot reach the data dir (root, a private
    home). A new instance at the same path started at the old fencing state and refused its
    first holders' leases with "fenced" (the autoscale e2e test, run again in the same
    directory, failed so)."""
    provider = lease_keyed(local, MASTER)
    first = await start(provider, local, "px-again")
    assert await asyncio.to_thread(status_via, lease(first, 7, 300), target) == 200
    for pid in processes_mentioning(str(first.instance_dir) + os.sep):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(first.instance_dir)

    second = await start(provider, local, "px-again")
    assert second.instance_dir == first.instance_dir
    assert await asyncio.to_thread(status_via, lease(second, 1, 300), target) == 200
