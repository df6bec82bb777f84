"""Leader election among watcher replicas through a coordination.k8s.io Lease."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.schemas import ProxyDeclared
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.kube import LEASES
from tests.support.waiting import until
from tests.support.watcher_harness import Bench, Replica, bench

pytestmark = pytest.mark.integration

LEASE = "egress-proxies-watcher"


async def ready(b: Bench, name: str) -> bool:
    status = b.status(name)
    return status.get("phase") == "Ready" and bool(status.get("ip"))


def leaders(replicas: list[Replica]) -> list[Replica]:
    return [r for r in replicas if r.service.term is not None]


def holder(b: Bench) -> str:
    lease = b.kube.get(LEASES, "default", LEASE) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def test_one_leader_works_and_a_standby_takes_over(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        replicas = [await b.watcher(election=True), await b.watcher(election=True)]

        async def one_leader() -> bool:
            return len(leaders(replicas)) == 1

        await until(one_leader, timeout=15)
        [leader] = leaders(replicas)
        [standby] = [r for r in replicas if r is not leader]
        assert leader.service.leadership is not None
        assert holder(b) == leader.service.leadership.identity
        first = b.create("de-1")
        await until(lambda: ready(b, "de-1"))
        # Only the leader lists and watches.
        assert standby.service.term is None

        await leader.stop()

        async def taken_over() -> bool:
            return standby.service.term is not None

        await until(taken_over, timeout=15)
        assert standby.service.leadership is not None
        assert holder(b) == standby.service.leadership.identity
        second = b.create("de-2")
        await until(lambda: ready(b, "de-2"))
        assert await b.count(first, ProxyDeclared) == 1
        assert await b.count(second, ProxyDeclared) == 1


async def test_a_silent_leader_loses_the_lease_when_it_expires(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        replicas = [await b.watcher(election=True), await b.watcher(election=True)]

        async def one_leader() -> bool:
            return len(leaders(replicas)) == 1

        await until(one_leader, timeout=15)
        [leader] = leaders(replicas)
        [standby] = [r for r in replicas if r is not leader]
        assert leader.service.leadership is not None
        identity = leader.service.leadership.identity
        # The leader dies without handing the Lease back (its last write fails): the standby
        # must wait for the lease to expire, then take it.
        b.kube.fail("update", LEASES, status=503, name=LEASE, times=None)
        await leader.stop()
        assert holder(b) == identity
        b.kube.clear_faults()

        async def taken_over() -> bool:
            return standby.service.term is not None

        await until(taken_over, timeout=20)
        assert standby.service.leadership is not None
        assert holder(b) == standby.service.leadership.identity
        b.create("de-1")
        await until(lambda: ready(b, "de-1"))
