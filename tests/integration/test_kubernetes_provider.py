"""The kubernetes provider against a Kubernetes API emulator over real HTTP (kubernetes_asyncio
makes real requests): the shared contract, the pod it creates, errors from the apiserver, and the
rule that API calls become spans only inside a trace.

Nothing runs pods here, so the test plays the kubelet: a background task marks every new pod
Running with its own address, through the server's object store (as the kubelet writes status).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
from kubernetes_asyncio import client as k8s
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from events.schemas import InstanceState, ProxySpec
from services.providers.base import (
    CreateRequest,
    NotFound,
    Permanent,
    QuotaExceeded,
    Transient,
)
from services.providers.kubernetes.config import DEFAULT_IMAGE, KubernetesConfig
from services.providers.kubernetes.provider import KubernetesProvider
from services.providers.kubernetes.pure.mapping import K8S_MANAGED, K8S_OWNER, K8S_PROVIDER
from services.runtime.kube.client import KubeSettings, new_api_client
from services.runtime.observability import telemetry
from tests.contract.provider import (
    MakeRequest,
    ProviderContract,
    Provoke,
    delete_all,
    request_factory,
)
from tests.support.kube import PODS, KubeCluster, start_kube, write_kubeconfig

pytestmark = pytest.mark.integration


@dataclass
class Kubelet:
    """Plays a node's kubelet: marks new pods Running with a distinct pod IP, and deletes
    gracefully (a deleted pod stays Terminating for a few ticks, held by a finalizer, as a real
    pod stays until its containers stop)."""

    kube: KubeCluster
    next_ip: int = 10
    paused: bool = False
    grace_ticks: int = 3
    _terminating: dict[tuple[str, str], int] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            if not self.paused:
                for pod in self.kube.list_objects(PODS):
                    self.tick(pod)
            await asyncio.sleep(0.02)

    def tick(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        if meta.get("deletionTimestamp"):
            if KUBELET in (meta.get("finalizers") or []):
                self._terminating[key] = self._terminating.get(key, 0) + 1
                if self._terminating[key] >= self.grace_ticks:
                    rest = [f for f in meta["finalizers"] if f != KUBELET]
                    self.kube.patch(PODS, *key, {"metadata": {"finalizers": rest or None}})
                    del self._terminating[key]
            return
        if (pod.get("status") or {}).get("phase") != "Pending":
            return
        self.next_ip += 1
        status = {
            "phase": "Running",
            "podIP": f"10.244.0.{self.next_ip}",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        self.kube.patch(PODS, *key, {"status": status}, status=True)
        finalizers = [*(meta.get("finalizers") or []), KUBELET]
        self.kube.patch(PODS, *key, {"metadata": {"finalizers": finalizers}})


KUBELET = "kubelet.test/running"


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[KubeCluster, Kubelet]]:
    async with start_kube(tmp_path) as kube:
        kubelet = Kubelet(kube)
        task = asyncio.create_task(kubelet.run())
        try:
            yield kube, kubelet
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def provider_for(kube: KubeCluster, name: str = "k8s", **settings: object) -> KubernetesProvider:
    """Through the providers-config path, as the executor builds it."""
    block = {"kubeconfig": kube.settings.kubeconfig, **settings}
    return KubernetesProvider.from_config(name, msgspec.convert(block, KubernetesConfig))


# ----------------------------------------------------------------------------- contract


class TestKubernetesContract(ProviderContract):
    ready_timeout: ClassVar[float] = 20.0

    @pytest.fixture
    async def kube(self, tmp_path: Path) -> AsyncIterator[KubeCluster]:
        async with cluster(tmp_path) as (kube, _):
            yield kube

    @pytest.fixture
    async def provider(self, kube: KubeCluster) -> AsyncIterator[KubernetesProvider]:
        provider = provider_for(kube)
        try:
            yield provider
        finally:
            kube.clear_faults()
            await delete_all(provider)
            await provider.close()

    @pytest.fixture
    def make_request(self) -> MakeRequest:
        return request_factory("k8s")

    @pytest.fixture
    async def provoke(
        self, kube: KubeCluster, provider: KubernetesProvider, make_request: MakeRequest
    ) -> AsyncIterator[Provoke]:
        kube.fail("create", PODS, status=422, name="bad-pod", message="spec.containers: Required")
        kube.fail(
            "create",
            PODS,
            status=403,
            name="quota",
            message='pods "quota" is forbidden: '
            "exceeded quota: compute, requested: pods=1, used: pods=10, limited: pods=10",
        )
        kube.fail("create", PODS, status=403, name="rbac", message="User cannot create pods")
        kube.fail("get", PODS, status=503, name="flaky", message="etcdserver: leader changed")
        unreachable = KubernetesProvider(
            "gone",
            KubernetesConfig(
                kubeconfig=str(dead_kubeconfig(Path(kube.settings.kubeconfig))), timeout_seconds=5
            ),
        )
        yield [
            ("422 invalid pod", lambda: provider.create(make_request("bad-pod"))),
            ("403 exceeded quota", lambda: provider.create(make_request("quota"))),
            ("403 forbidden", lambda: provider.create(make_request("rbac"))),
            ("503 on get", lambda: provider.get("default/flaky")),
            ("connection refused", unreachable.list_by_tag),
        ]
        await unreachable.close()


def dead_kubeconfig(near: Path) -> Path:
    """A kubeconfig naming a port nothing listens on."""
    import socket  # noqa: PLC0415 - only this helper needs it

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return write_kubeconfig(near.parent / "dead-kubeconfig", f"http://127.0.0.1:{port}")


# ----------------------------------------------------------------------------- beyond the contract


@pytest.fixture
async def kube_and_kubelet(tmp_path: Path) -> AsyncIterator[tuple[KubeCluster, Kubelet]]:
    async with cluster(tmp_path) as pair:
        yield pair


@pytest.fixture
async def provider(
    kube_and_kubelet: tuple[KubeCluster, Kubelet],
) -> AsyncIterator[KubernetesProvider]:
    provider = provider_for(kube_and_kubelet[0])
    try:
        yield provider
    finally:
        await provider.close()


def request_in(namespace: str, name: str, owner: str = "uid-1") -> CreateRequest:
    return CreateRequest(
        name=name,
        owner_uid=owner,
        namespace=namespace,
        proxy_name="squid-1",
        spec=ProxySpec(provider="k8s"),
        spec_hash="abcd1234",
    )


async def test_the_pod_is_a_squid_in_the_proxys_namespace(
    kube_and_kubelet: tuple[KubeCluster, Kubelet], provider: KubernetesProvider
) -> None:
    kube, _ = kube_and_kubelet
    provider_id = await provider.create(request_in("crawlers", "px-0f3a-abcd1234", "uid-7"))
    assert provider_id == "crawlers/px-0f3a-abcd1234"
    pod = kube.get(PODS, "crawlers", "px-0f3a-abcd1234")
    assert pod is not None
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels[K8S_MANAGED] == "true"
    assert labels[K8S_OWNER] == "uid-7"
    assert labels[K8S_PROVIDER] == "k8s"
    assert annotations["crawl.example.com/created-at"].endswith("+00:00")
    container = pod["spec"]["containers"][0]
    assert container["image"] == DEFAULT_IMAGE
    assert container["ports"][0]["containerPort"] == 3128
    conf = container["env"][0]["value"]
    assert "http_port 3128" in conf
    assert "acl egress_clients src 10.0.0.0/8" in conf
    assert pod["spec"]["automountServiceAccountToken"] is False


async def test_image_and_port_come_from_the_provider_config(
    kube_and_kubelet: tuple[KubeCluster, Kubelet],
) -> None:
    kube, _ = kube_and_kubelet
    provider = provider_for(kube, image="registry.example/squid:7", port=8080)
    try:
        provider_id = await provider.create(request_in("default", "px-img"))
        pod = kube.get(PODS, "default", "px-img")
        assert pod is not None
        assert pod["spec"]["containers"][0]["image"] == "registry.example/squid:7"
        instance = await ProviderContract().running(provider, provider_id)
        assert instance.url == f"http://{instance.ip}:8080"
    finally:
        await provider.close()


async def test_a_pod_of_another_proxy_under_the_name_is_never_adopted(
    provider: KubernetesProvider,
) -> None:
    await provider.create(request_in("default", "px-same", owner="uid-a"))
    with pytest.raises(Permanent, match="belongs to uid-a"):
        await provider.create(request_in("default", "px-same", owner="uid-b"))


async def test_states_follow_the_pod(
    kube_and_kubelet: tuple[KubeCluster, Kubelet], provider: KubernetesProvider
) -> None:
    kube, kubelet = kube_and_kubelet
    kubelet.paused = True
    provider_id = await provider.create(request_in("default", "px-states"))
    pending = await provider.get(provider_id)
    assert pending.state is InstanceState.PENDING
    assert pending.ip == ""
    assert pending.url == ""
    kube.patch(PODS, "default", "px-states", {"status": {"phase": "Running"}}, status=True)
    assert (await provider.get(provider_id)).state is InstanceState.PENDING  # no IP yet
    kube.patch(PODS, "default", "px-states", {"status": {"podIP": "10.244.9.9"}}, status=True)
    running = await provider.get(provider_id)
    assert running.state is InstanceState.RUNNING
    assert running.url == "http://10.244.9.9:3128"
    kube.patch(PODS, "default", "px-states", {"status": {"phase": "Failed"}}, status=True)
    assert (await provider.get(provider_id)).state is InstanceState.STOPPED
    # A pod the kubelet is still shutting down (a finalizer holds it here) is Terminating.
    kube.patch(PODS, "default", "px-states", {"metadata": {"finalizers": ["test/hold"]}})
    await provider.delete(provider_id)
    assert (await provider.get(provider_id)).state is InstanceState.TERMINATING
    await provider.delete(provider_id)  # idempotent while terminating
    kube.patch(PODS, "default", "px-states", {"metadata": {"finalizers": None}})
    with pytest.raises(NotFound):
        await provider.get(provider_id)


async def test_list_by_tag_spans_namespaces_and_only_this_providers_pods(
    kube_and_kubelet: tuple[KubeCluster, Kubelet], provider: KubernetesProvider
) -> None:
    kube, _ = kube_and_kubelet
    other = provider_for(kube, name="k8s-other")
    try:
        a = await provider.create(request_in("team-a", "px-a", owner="uid-a"))
        b = await provider.create(request_in("team-b", "px-b", owner="uid-b"))
        await other.create(request_in("team-a", "px-other"))
        kube.create(PODS, {"metadata": {"name": "unrelated", "labels": {"app": "web"}}}, "team-a")
        listed = {i.provider_id: i for i in await provider.list_by_tag()}
        assert set(listed) == {a, b}
        assert listed[b].owner_uid == "uid-b"
        assert [i.provider_id for i in await other.list_by_tag()] == ["team-a/px-other"]
        with pytest.raises(NotFound):
            await provider.get("team-a/unrelated")  # exists, but not ours
    finally:
        await other.close()


async def test_errors_land_in_the_right_class(
    kube_and_kubelet: tuple[KubeCluster, Kubelet], provider: KubernetesProvider
) -> None:
    kube, _ = kube_and_kubelet
    kube.fail("create", PODS, status=403, name="px-q", message="exceeded quota: pods")
    kube.fail("create", PODS, status=429, name="px-t", message="too many requests")
    kube.fail("create", PODS, status=422, name="px-i", message="spec: Invalid value")
    kube.fail("create", PODS, status=404, name="px-n", message='namespaces "nope" not found')
    kube.fail("delete", PODS, status=500, name="px-d", message="etcd timeout")
    kube.fail("list", PODS, status=403, message="cannot list pods at the cluster scope")
    with pytest.raises(QuotaExceeded, match="exceeded quota"):
        await provider.create(request_in("default", "px-q"))
    with pytest.raises(Transient):
        await provider.create(request_in("default", "px-t"))
    with pytest.raises(Permanent, match="Invalid"):
        await provider.create(request_in("default", "px-i"))
    with pytest.raises(Permanent, match="not found"):
        await provider.create(request_in("nope", "px-n"))
    with pytest.raises(Transient):
        await provider.delete("default/px-d")
    with pytest.raises(Permanent, match="cluster scope"):
        await provider.list_by_tag()


async def test_a_slow_apiserver_is_transient(
    kube_and_kubelet: tuple[KubeCluster, Kubelet],
) -> None:
    kube, _ = kube_and_kubelet
    provider = provider_for(kube, timeoutSeconds=0.3)
    kube.fail("get", PODS, status=500, name="px-slow", delay=5.0)
    try:
        with pytest.raises(Transient, match="no answer"):
            await provider.get("default/px-slow")
    finally:
        await provider.close()


# ----------------------------------------------------------------------------- tracing


async def test_api_calls_are_client_spans_only_inside_a_trace(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async with start_kube(tmp_path) as kube:
        api = await new_api_client(KubeSettings(kubeconfig=kube.settings.kubeconfig))
        async with api:
            core = k8s.CoreV1Api(api)
            # A renewal or a watch poll outside any trace: no root span.
            await core.list_namespaced_pod("default")
            assert spans.get_finished_spans() == ()
            with telemetry.tracer("test").start_as_current_span("Reconcile Proxy") as parent:
                await core.list_namespaced_pod("default")
                with pytest.raises(k8s.ApiException):
                    await core.read_namespaced_pod("missing", "default")
            finished = {s.name: s for s in spans.get_finished_spans()}
            assert set(finished) == {"Reconcile Proxy", "GET pods"}
            client = [s for s in spans.get_finished_spans() if s.name == "GET pods"]
            assert len(client) == 2
            for span in client:
                assert span.kind is SpanKind.CLIENT
                assert span.parent is not None
                assert span.parent.span_id == parent.get_span_context().span_id
            codes = sorted(
                int(str((s.attributes or {}).get("http.response.status_code"))) for s in client
            )
            assert codes == [200, 404]
            assert not trace.get_current_span().get_span_context().is_valid


async def test_a_create_while_the_old_pod_terminates_is_transient(
    kube_and_kubelet: tuple[KubeCluster, Kubelet], provider: KubernetesProvider
) -> None:
    _, kubelet = kube_and_kubelet
    request = request_in("default", "px-again")
    contract = ProviderContract()
    first = await contract.running(provider, await provider.create(request))
    kubelet.paused = True  # the container takes its time to stop
    await provider.delete(first.provider_id)
    assert (await provider.get(first.provider_id)).state is InstanceState.TERMINATING
    with pytest.raises(Transient, match="still being deleted"):
        await provider.create(request)
    kubelet.paused = False
    await contract.gone(provider, first.provider_id)
    second = await contract.running(provider, await provider.create(request))
    assert second.instance_uid != first.instance_uid
