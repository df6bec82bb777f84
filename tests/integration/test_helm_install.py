"""The chart installed by the pinned ``helm`` on a real kube-apiserver (RBAC on): every object
is accepted (the NetworkPolicies and PodDisruptionBudgets by the server's own validation), the
watcher runs as the chart's ServiceAccount and a Proxy goes Ready through the real loop
(reconciler and executor on a fake provider), elected through a Lease in the release's
namespace; and a cluster that ran the kustomize base moves to the chart without recreating an
object (docs/kubernetes.md, "Helm").

The module has a kube-apiserver of its own: the chart's cluster-wide objects have the kustomize
base's names, which other tests create on the shared one with ``kubectl apply -k deploy/``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from events import subjects
from events.schemas import ProxyDeclared
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.kube.client import KubeSettings
from services.runtime.nats.server import EmbeddedNatsServer
from services.testing.provider import FakeProvider
from services.watcher.leader import LeaderSettings
from services.watcher.service import WatcherService
from tests.support.apiserver import DEPLOY, ApiServer, poll, running_apiserver
from tests.support.helm import CHART, RELEASE, Helm, kustomize, parse
from tests.support.lifecycle import start
from tests.support.markers import starts
from tests.support.waiting import until
from tests.support.watcher_harness import Replica, fleet

pytestmark = pytest.mark.integration

# Values an operator would set, so that the server validates those paths too: the egress of a
# gcp provider (docs/kubernetes.md, "Helm") and the discovery clients file.
VALUES: dict[str, Any] = {
    "networkPolicy": {"providerEgress": [{"ports": [{"port": 443, "protocol": "TCP"}]}]},
    "services": {"discovery": {"clientsFile": {"enabled": True}}},
}


@pytest.fixture(scope="module")
@starts("etcd and kube-apiserver")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    with running_apiserver(tmp_path_factory.mktemp("helm-apiserver")) as server:
        yield server


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(tmp_path_factory.mktemp("helm-home"))


def installed(helm: Helm, cluster: ApiServer, namespace: str) -> list[dict[str, Any]]:
    """The objects of the release, as the server holds them."""
    manifest = helm.run("get", "manifest", RELEASE, "-n", namespace, kubeconfig=cluster.kubeconfig)
    found = []
    for doc in parse(manifest.stdout):
        meta = doc["metadata"]
        obj = cluster.get(doc["kind"], meta["name"], meta.get("namespace", ""))
        assert obj is not None, f"{doc['kind']} {meta['name']} is not on the server"
        found.append(obj)
    return found


def uninstall(helm: Helm, cluster: ApiServer, namespace: str) -> None:
    helm.run(
        "uninstall", RELEASE, "-n", namespace, "--ignore-not-found", kubeconfig=cluster.kubeconfig
    )


def can(cluster: ApiServer, kubeconfig: Path, *args: str) -> bool:
    done = cluster.kubectl("auth", "can-i", *args, kubeconfig=kubeconfig, check=False)
    return done.stdout.strip() == "yes"


async def test_the_chart_installs_and_the_watcher_works_as_its_service_account(
    helm: Helm,
    cluster: ApiServer,
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    tmp_path: Path,
) -> None:
    namespace = "egress-helm"  # not kustomize's: the bindings must follow the release
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    install = ["install", RELEASE, str(CHART), "-n", namespace, "--create-namespace"]
    await asyncio.to_thread(helm.run, *install, "-f", str(values), kubeconfig=cluster.kubeconfig)
    try:
        status = helm.run(
            "status", RELEASE, "-n", namespace, "-o", "json", kubeconfig=cluster.kubeconfig
        )
        assert json.loads(status.stdout)["info"]["status"] == "deployed"
        kinds = {
            obj["kind"] for obj in await asyncio.to_thread(installed, helm, cluster, namespace)
        }
        assert {"Deployment", "NetworkPolicy", "PodDisruptionBudget", "ClusterRole"} <= kinds
        await asyncio.to_thread(serving_proxies, cluster)

        watcher = await asyncio.to_thread(cluster.kubeconfig_for, namespace, "egress-watcher")
        uid = await runs_a_proxy_to_ready(cluster, watcher, namespace, nats_server.url, tmp_path)
        declared = (await jetstream_store.read(subjects.proxy(uid))).decoded()
        assert sum(isinstance(e, ProxyDeclared) for e in declared) == 1

        # The other accounts hold nothing of the watcher's, and it nothing of theirs.
        no_api = await asyncio.to_thread(cluster.kubeconfig_for, namespace, "egress-no-api")
        executor = await asyncio.to_thread(cluster.kubeconfig_for, namespace, "egress-executor")
        assert not can(cluster, no_api, "list", "proxies.crawl.example.com", "-A")
        assert not can(cluster, executor, "list", "secrets", "-A")
        assert can(cluster, executor, "create", "pods", "-n", "crawl")
        assert not can(cluster, watcher, "create", "pods", "-n", "crawl")
        assert not can(cluster, watcher, "update", "leases", "-n", "default")
    finally:
        await asyncio.to_thread(uninstall, helm, cluster, namespace)
    # Helm never deletes a CRD from crds/: the Proxies outlive the release.
    assert cluster.get("crd", "proxies.crawl.example.com", "") is not None
    assert cluster.get("clusterrole", "egress-proxies-watcher", "") is None


def serving_proxies(cluster: ApiServer) -> None:
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/proxies.crawl.example.com", "--timeout=60s"
    )
    # Established is not yet servable: wait until the Proxies list answers.
    poll(
        lambda: cluster.kubectl("get", "px", "-A", check=False).returncode == 0,
        60,
        "kubectl get px -A",
    )


async def runs_a_proxy_to_ready(
    cluster: ApiServer, kubeconfig: Path, namespace: str, nats_url: str, data_dir: Path
) -> str:
    """A watcher on ``kubeconfig``, electing itself through a Lease in ``namespace`` (as in the
    pod: POD_NAMESPACE), takes a Proxy to Ready and records its Events; returns its uid."""
    crawl = await asyncio.to_thread(cluster.namespace, "crawl")
    proxy = {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "squid-1", "namespace": crawl},
        "spec": {"provider": "fake"},
    }
    leader = LeaderSettings(namespace=namespace, lease_duration=3, renew_deadline=2, retry_period=1)
    service = WatcherService(
        kube=KubeSettings(kubeconfig=str(kubeconfig)), leader=leader, retry_delay=0.2
    )

    async def ready() -> bool:
        obj = await asyncio.to_thread(cluster.get, "px", "squid-1", crawl)
        return ((obj or {}).get("status") or {}).get("phase") == "Ready"

    async with fleet(nats_url, FakeProvider(pending_polls=1), data_dir):
        tasks: list[asyncio.Task[None]] = []
        await start(nats_url, service, tasks)
        replica = Replica(service, tasks[0])
        try:
            await until(lambda: service.term is not None, timeout=30, what="the leadership")
            await asyncio.to_thread(cluster.apply, proxy)
            await until(ready, timeout=30, what="the Proxy Ready")
            assert service.leadership is not None
            identity = service.leadership.identity

            async def renewed() -> bool:
                lease = await asyncio.to_thread(cluster.get, "lease", leader.name, namespace)
                spec = (lease or {}).get("spec") or {}
                assert spec.get("holderIdentity") == identity, spec
                return bool(spec.get("renewTime", "") > spec.get("acquireTime", ""))

            # A renewal is an update: the Role must grant it, not only the create.
            await until(renewed, timeout=15, what="the leader renewing its Lease")
            events = await asyncio.to_thread(
                cluster.kubectl, "get", "events", "-n", crawl, "-o", "json"
            )
            reasons = {e["reason"] for e in json.loads(events.stdout)["items"]}
            assert "InstanceRunning" in reasons, reasons
            obj = await asyncio.to_thread(cluster.get, "px", "squid-1", crawl)
            return str((obj or {})["metadata"]["uid"])
        finally:
            await replica.stop()


def test_a_cluster_on_the_kustomize_base_moves_to_the_chart(helm: Helm, cluster: ApiServer) -> None:
    namespace = "egress-proxies"  # the base's own
    cluster.kubectl("apply", "-k", str(DEPLOY))
    before = {
        (o["kind"], o["metadata"]["name"]): o["metadata"]["uid"]
        for o in (
            cluster.get(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", ""))
            for d in kustomize()
        )
        if o is not None
    }
    # The adoption, as docs/kubernetes.md gives it: Helm takes over objects that name the release.
    base = cluster.kubectl("kustomize", str(DEPLOY)).stdout
    annotate = ["annotate", "-f", "-", "--overwrite", f"meta.helm.sh/release-name={RELEASE}"]
    cluster.kubectl(*annotate, f"meta.helm.sh/release-namespace={namespace}", input=base)
    label = ["label", "-f", "-", "--overwrite", "app.kubernetes.io/managed-by=Helm"]
    cluster.kubectl(*label, input=base)
    try:
        helm.run("install", RELEASE, str(CHART), "-n", namespace, kubeconfig=cluster.kubeconfig)
        objects = installed(helm, cluster, namespace)
        adopted = {(o["kind"], o["metadata"]["name"]): o["metadata"]["uid"] for o in objects}
        kept = {k: v for k, v in adopted.items() if k in before}
        assert kept == {k: v for k, v in before.items() if k in adopted}, "recreated, not adopted"
        assert {"Deployment", "ClusterRole", "ConfigMap"} <= {kind for kind, _ in kept}
        watcher = cluster.get("deploy", "egress-watcher", namespace)
        assert watcher is not None
        assert watcher["metadata"]["labels"]["helm.sh/chart"].startswith("egress-proxies-")

        # An upgrade applies new values to the adopted objects.
        upgrade = ["upgrade", RELEASE, str(CHART), "-n", namespace]
        helm.run(*upgrade, "--set", "services.watcher.replicas=3", kubeconfig=cluster.kubeconfig)
        watcher = cluster.get("deploy", "egress-watcher", namespace)
        assert watcher is not None
        assert watcher["spec"]["replicas"] == 3
        assert watcher["metadata"]["uid"] == before[("Deployment", "egress-watcher")]
    finally:
        uninstall(helm, cluster, namespace)
