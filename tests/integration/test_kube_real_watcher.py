"""The watcher against a real kube-apiserver, as its ServiceAccount (``egress-watcher``): it
survives an apiserver restart and a real ``410 Gone``, and two replicas elect one leader through
a real ``coordination.k8s.io`` Lease. The reconciler and executor run too (fake provider), so a
Proxy going Ready shows the whole loop: declared into the log, status written back.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from events import subjects
from events.schemas import ProxyDeclared
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.kube.client import KubeApiError, KubeGone, KubeSettings, new_api_client
from services.runtime.nats.server import EmbeddedNatsServer
from services.testing.provider import FakeProvider
from services.watcher import service as watcher_service
from services.watcher.customobjects import Raw
from services.watcher.leader import LeaderSettings
from services.watcher.proxykube import ProxyApi
from services.watcher.service import WatcherService
from tests.support.apiserver import SYSTEM_NAMESPACE, ApiServer, poll
from tests.support.lifecycle import start
from tests.support.waiting import until
from tests.support.watcher_harness import Replica, fleet

pytestmark = pytest.mark.integration

_leases = itertools.count(1)
TOO_MANY_REQUESTS = 429


@pytest.fixture(scope="module")
def watcher_kubeconfig(apiserver: ApiServer) -> Path:
    apiserver.deploy_base()
    # Established is not yet servable: wait until the Proxies list answers.
    poll(
        lambda: apiserver.kubectl("get", "px", "-A", check=False).returncode == 0,
        60,
        "kubectl get px -A",
    )
    return apiserver.kubeconfig_for(SYSTEM_NAMESPACE, "egress-watcher")


def proxy(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"provider": "fake"},
    }


@dataclass
class Cluster:
    apiserver: ApiServer
    kubeconfig: Path
    url: str
    store: JetStreamEventStore
    namespace: str
    lease: str = field(default_factory=lambda: f"egress-watcher-test-{next(_leases)}")
    replicas: list[Replica] = field(default_factory=list)

    async def watcher(self, *, election: bool = False) -> Replica:
        leader = LeaderSettings(
            namespace=SYSTEM_NAMESPACE,
            name=self.lease,
            lease_duration=3,
            renew_deadline=2,
            retry_period=1,
        )
        service = WatcherService(
            kube=KubeSettings(kubeconfig=str(self.kubeconfig)),
            leader=leader if election else None,
            retry_delay=0.2,
        )
        tasks: list[asyncio.Task[None]] = []
        await start(self.url, service, tasks)
        replica = Replica(service, tasks[0])
        self.replicas.append(replica)
        return replica

    async def create(self, name: str) -> str:
        await asyncio.to_thread(self.apiserver.apply, proxy(self.namespace, name))
        obj = await self.get(name)
        assert obj is not None
        return str(obj["metadata"]["uid"])

    async def get(self, name: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.apiserver.get, "px", name, self.namespace)

    async def ready(self, name: str) -> bool:
        obj = await self.get(name)
        status = (obj or {}).get("status") or {}
        return status.get("phase") == "Ready" and bool(status.get("ip"))

    async def declared(self, uid: str) -> int:
        events = (await self.store.read(subjects.proxy(uid))).decoded()
        return sum(isinstance(e, ProxyDeclared) for e in events)

    async def holder(self) -> str:
        lease = await asyncio.to_thread(self.apiserver.get, "lease", self.lease, SYSTEM_NAMESPACE)
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


@pytest.fixture
async def cluster(
    apiserver: ApiServer,
    watcher_kubeconfig: Path,
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    tmp_path: Path,
) -> AsyncIterator[Cluster]:
    namespace = await asyncio.to_thread(apiserver.namespace, "watch")
    c = Cluster(apiserver, watcher_kubeconfig, nats_server.url, jetstream_store, namespace)
    async with fleet(nats_server.url, FakeProvider(pending_polls=1), tmp_path):
        try:
            yield c
        finally:
            for replica in c.replicas:
                await replica.stop()


def leaders(replicas: list[Replica]) -> list[Replica]:
    return [r for r in replicas if r.service.term is not None]


def relists(replica: Replica) -> int:
    term = replica.service.term
    return term.sync.relists if term is not None else 0


async def watch_error(api: ProxyApi, resource_version: str) -> KubeApiError:
    """What a watch from ``resource_version`` fails with (an event instead fails the test)."""
    try:
        async for event in api.watch_objects(resource_version):
            pytest.fail(f"a watch from {resource_version} gave {event['type']}, not an error")
    except KubeApiError as exc:
        return exc
    pytest.fail(f"a watch from {resource_version} ended without an error")


# ----------------------------------------------------------------------------- apiserver restart


async def test_the_watcher_carries_on_through_an_apiserver_restart(cluster: Cluster) -> None:
    replica = await cluster.watcher()
    before = await cluster.create("before")
    await until(lambda: cluster.ready("before"), timeout=30, what="the first Proxy Ready")
    listed = relists(replica)

    await asyncio.to_thread(cluster.apiserver.restart)

    after = await cluster.create("after")
    await until(lambda: cluster.ready("after"), timeout=60, what="a Proxy created after Ready")
    assert relists(replica) > listed  # its watch ended with the server; it listed again
    assert await cluster.ready("before")
    assert await cluster.declared(before) == 1
    assert await cluster.declared(after) == 1


# ----------------------------------------------------------------------------- 410 Gone


async def test_a_real_410_makes_the_watcher_list_again_and_carry_on(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = await new_api_client(KubeSettings(kubeconfig=str(cluster.apiserver.kubeconfig)))
    async with admin:
        _, stale = await ProxyApi(admin).list_objects()
    await cluster.create("old")
    # etcd forgets the history, and the restarted server's watch cache starts after ``stale``:
    # a watch from it (a resume after the watcher lost its connection) is refused for real.
    await asyncio.to_thread(cluster.apiserver.compact)
    await asyncio.to_thread(cluster.apiserver.restart)
    admin = await new_api_client(KubeSettings(kubeconfig=str(cluster.apiserver.kubeconfig)))
    async with admin:
        answers: list[KubeApiError] = []

        async def refused() -> bool:
            answers.append(await watch_error(ProxyApi(admin), stale))
            # 429 while the restarted server (re)initializes the Proxies' storage.
            return answers[-1].status != TOO_MANY_REQUESTS

        await until(refused, timeout=60, every=0.2, what="an answer other than 429")
    assert isinstance(answers[-1], KubeGone), answers[-1]
    assert "too old resource version" in str(answers[-1])

    # The watcher's first watch resumes from that same stale version, as after a lost
    # connection; everything else is the product's own.
    resumed: list[str] = []

    class ResumingFromStale(ProxyApi):
        def watch_objects(self, resource_version: str) -> AsyncGenerator[Raw, None]:
            if not resumed:
                resumed.append(resource_version)
                resource_version = stale
            return super().watch_objects(resource_version)

    monkeypatch.setattr(watcher_service, "ProxyApi", ResumingFromStale)
    with capture_logs() as logs:
        replica = await cluster.watcher()
        await until(lambda: cluster.ready("old"), timeout=30, what="the Proxy from before Ready")
        await until(lambda: relists(replica) >= 2, timeout=30, what="a second listing")
    assert any("410 Gone" in str(entry.get("event")) for entry in logs), logs
    new = await cluster.create("new")
    await until(lambda: cluster.ready("new"), timeout=30, what="a Proxy created after Ready")
    assert await cluster.declared(new) == 1


# ----------------------------------------------------------------------------- leader election


async def test_one_replica_holds_the_real_lease_and_a_standby_takes_over(
    cluster: Cluster,
) -> None:
    replicas = [await cluster.watcher(election=True), await cluster.watcher(election=True)]
    await until(lambda: len(leaders(replicas)) == 1, timeout=30, what="one leader")
    [leader] = leaders(replicas)
    [standby] = [r for r in replicas if r is not leader]
    assert leader.service.leadership is not None
    assert standby.service.leadership is not None
    assert await cluster.holder() == leader.service.leadership.identity
    first = await cluster.create("de-1")
    await until(lambda: cluster.ready("de-1"), timeout=30, what="de-1 Ready")
    assert standby.service.term is None  # only the leader lists and watches

    await leader.stop()
    await until(lambda: standby.service.term is not None, timeout=30, what="the takeover")
    identity = standby.service.leadership.identity
    assert await cluster.holder() == identity
    second = await cluster.create("de-2")
    await until(lambda: cluster.ready("de-2"), timeout=30, what="de-2 Ready")
    assert await cluster.declared(first) == 1
    assert await cluster.declared(second) == 1


# ----------------------------------------------------------------------------- watcher restart


async def test_a_restarted_watcher_keeps_the_state_and_declares_nothing_twice(
    cluster: Cluster,
) -> None:
    first = await cluster.watcher()
    uids = {name: await cluster.create(name) for name in ("r-1", "r-2")}
    for name in uids:
        await until(functools.partial(cluster.ready, name), timeout=30, what=f"{name} Ready")
    status_before = {name: ((await cluster.get(name)) or {}).get("status") for name in uids}
    await first.stop()

    second = await cluster.watcher()
    await until(lambda: relists(second) >= 1, timeout=30, what="the new watcher's listing")
    third = await cluster.create("r-3")
    await until(lambda: cluster.ready("r-3"), timeout=30, what="r-3 Ready")
    for name, uid in uids.items():
        obj = await cluster.get(name)
        assert obj is not None
        assert "crawl.example.com/finalizer" in str(obj["metadata"].get("finalizers"))
        assert obj["status"]["phase"] == "Ready"
        assert obj["status"]["ip"] == (status_before[name] or {})["ip"]
        assert await cluster.declared(uid) == 1
    assert await cluster.declared(third) == 1
