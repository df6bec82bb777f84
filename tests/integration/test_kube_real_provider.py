"""The kubernetes provider's shared contract against a real kube-apiserver, as the executor's
ServiceAccount (``egress-executor``, deploy/rbac/executor.yaml): every pod is created, read,
listed and deleted by the real server, and every error the contract provokes is a real refusal
(the server's validation, a ResourceQuota, RBAC, a missing namespace, a closed port).

There is no scheduler, kubelet or controller-manager, so the test plays them, through the admin:
it creates each namespace's ``default`` ServiceAccount (the ServiceAccount admission plugin looks
it up), binds each new pod to a node (``pods/binding``, as the scheduler does), patches its status
Running with an address (``pods/status``, as the kubelet does), and finishes a graceful deletion
by deleting with grace 0 once the pod is Terminating (as the kubelet does when its containers have
stopped). A bound pod is deleted gracefully by the server (it stays Terminating until then); an
unbound one would vanish at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import msgspec
import pytest
from kubernetes_asyncio import client as k8s

from events.schemas import InstanceState, ProxySpec
from services.providers.base import CreateRequest, Permanent, QuotaExceeded, Transient
from services.providers.kubernetes.config import KubernetesConfig
from services.providers.kubernetes.provider import KubernetesProvider
from services.providers.kubernetes.pure.mapping import K8S_MANAGED, K8S_PROVIDER
from services.runtime.kube.client import KubeSettings, new_api_client
from tests.contract.provider import MakeRequest, ProviderContract, Provoke, delete_all
from tests.support.apiserver import SYSTEM_NAMESPACE, ApiServer

pytestmark = pytest.mark.integration

NODE = "node-1"
_providers = itertools.count(1)


@dataclass
class Kubelet:
    """The scheduler and kubelet of one node, for pods of the provider under test: binds each
    pod to ``NODE``, marks it Running with a distinct address, and deletes it for good a few
    ticks after the server marked it Terminating."""

    core: k8s.CoreV1Api
    selector: str
    next_ip: int = 10
    paused: bool = False
    stopped: bool = False
    grace_ticks: int = 3
    _terminating: dict[tuple[str, str], int] = field(default_factory=dict)

    async def run(self) -> None:
        while not self.stopped:
            if not self.paused:
                listed = await self.core.list_pod_for_all_namespaces(label_selector=self.selector)
                for pod in listed.items:
                    try:
                        await self.tick(pod)
                    except k8s.ApiException as exc:
                        if exc.status not in (404, 409):
                            raise
                        # Deleted or changed since the listing: the next tick sees it as it is.
            await asyncio.sleep(0.05)

    async def tick(self, pod: k8s.V1Pod) -> None:
        name, namespace = pod.metadata.name, pod.metadata.namespace
        key = (namespace, name)
        if pod.metadata.deletion_timestamp is not None:
            ticks = self._terminating.get(key, 0) + 1
            self._terminating[key] = ticks
            if ticks >= self.grace_ticks:
                del self._terminating[key]
                options = k8s.V1DeleteOptions(
                    grace_period_seconds=0,
                    preconditions=k8s.V1Preconditions(uid=pod.metadata.uid),
                )
                with contextlib.suppress(k8s.ApiException):  # gone or replaced meanwhile
                    await self.core.delete_namespaced_pod(name, namespace, body=options)
            return
        if not pod.spec.node_name:
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
            }
            # Without preloading (the generated client cannot read a Binding back): the raw
            # response, released so its connection goes back to the pool.
            response = await self.core.create_namespaced_pod_binding(
                name, namespace, binding, _preload_content=False
            )
            response.release()
        if (pod.status.phase or "Pending") != "Pending":
            return
        self.next_ip += 1
        ip = f"10.244.0.{self.next_ip}"
        status = {
            "status": {
                "phase": "Running",
                "hostIP": "10.0.0.1",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        }
        await self.core.patch_namespaced_pod_status(name, namespace, status)


@pytest.fixture(scope="module")
def executor_kubeconfig(apiserver: ApiServer) -> Path:
    apiserver.deploy_base()
    return apiserver.kubeconfig_for(SYSTEM_NAMESPACE, "egress-executor")


def workload_namespace(apiserver: ApiServer) -> str:
    """A namespace as a cluster has it: with its ``default`` ServiceAccount."""
    namespace = apiserver.namespace("pods")
    apiserver.kubectl("create", "serviceaccount", "default", "-n", namespace)
    return namespace


def provider_with(kubeconfig: Path, name: str, **settings: object) -> KubernetesProvider:
    """Through the providers-config path, as the executor builds it."""
    block = {"kubeconfig": str(kubeconfig), "timeoutSeconds": 10, **settings}
    return KubernetesProvider.from_config(name, msgspec.convert(block, KubernetesConfig))


def requests_in(namespace: str, provider_name: str) -> MakeRequest:
    def make(name: str, owner_uid: str = "owner-1") -> CreateRequest:
        return CreateRequest(
            name=name,
            owner_uid=owner_uid,
            namespace=namespace,
            proxy_name=name,
            spec=ProxySpec(provider=provider_name),
            spec_hash="h1",
        )

    return make


@dataclass
class Setup:
    name: str
    namespace: str
    kubelet: Kubelet


@contextlib.asynccontextmanager
async def node(apiserver: ApiServer, provider_name: str) -> AsyncIterator[Kubelet]:
    """A Kubelet for ``provider_name``'s pods, running until the block ends."""
    api = await new_api_client(KubeSettings(kubeconfig=str(apiserver.kubeconfig)))
    async with api:
        kubelet = Kubelet(k8s.CoreV1Api(api), f"{K8S_MANAGED}=true,{provider_label(provider_name)}")
        task = asyncio.create_task(kubelet.run())
        try:
            yield kubelet
        finally:
            # Stopped between two ticks, not cancelled inside a request: a request cancelled
            # in flight can leave its connection to the apiserver unclosed until collected.
            kubelet.stopped = True
            try:
                async with asyncio.timeout(30):
                    await task
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def provider_label(provider_name: str) -> str:
    return f"{K8S_PROVIDER}={provider_name}"


# ----------------------------------------------------------------------------- contract


@pytest.fixture
async def setup(apiserver: ApiServer) -> AsyncIterator[Setup]:
    """A provider name of its own (its pods are the only ones it lists), a namespace, a node."""
    name = f"k8s-real-{next(_providers)}"
    namespace = await asyncio.to_thread(workload_namespace, apiserver)
    async with node(apiserver, name) as kubelet:
        yield Setup(name, namespace, kubelet)


@pytest.fixture
async def provider(setup: Setup, executor_kubeconfig: Path) -> AsyncIterator[KubernetesProvider]:
    provider = provider_with(executor_kubeconfig, setup.name)
    try:
        yield provider
        await delete_all(provider)
    finally:
        await provider.close()


@pytest.fixture
def make_request(setup: Setup) -> MakeRequest:
    return requests_in(setup.namespace, setup.name)


@pytest.fixture
async def provoke(
    apiserver: ApiServer,
    setup: Setup,
    executor_kubeconfig: Path,
    make_request: MakeRequest,
) -> AsyncIterator[Provoke]:
    # Requests above the limit: the server's pod validation answers 422.
    invalid = provider_with(
        executor_kubeconfig, setup.name, memoryRequest="512Mi", memoryLimit="256Mi"
    )
    # A namespace whose ResourceQuota allows no pods; its status is what the quota
    # controller would have written (the admission plugin refuses a quota without one).
    full = await asyncio.to_thread(workload_namespace, apiserver)
    await asyncio.to_thread(quota_of_no_pods, apiserver, full)
    # The gc's ServiceAccount may list and delete pods, not create them: RBAC answers 403.
    gc = provider_with(
        await asyncio.to_thread(apiserver.kubeconfig_for, SYSTEM_NAMESPACE, "egress-gc"),
        setup.name,
    )
    plain = provider_with(executor_kubeconfig, setup.name)
    unreachable = provider_with(dead_kubeconfig(executor_kubeconfig), "gone", timeoutSeconds=5)
    elsewhere = requests_in(full, setup.name)
    nowhere = requests_in(f"no-such-{setup.namespace}", setup.name)
    yield [
        ("422 invalid pod", lambda: invalid.create(make_request("bad-pod"))),
        ("403 exceeded quota", lambda: plain.create(elsewhere("quota"))),
        ("403 forbidden", lambda: gc.create(make_request("rbac"))),
        ("404 namespace on create", lambda: plain.create(nowhere("nons"))),
        ("connection refused", unreachable.list_by_tag),
    ]
    for extra in (invalid, plain, gc, unreachable):
        await extra.close()


class TestKubernetesContractOnARealServer(ProviderContract):
    ready_timeout: ClassVar[float] = 30.0


def quota_of_no_pods(apiserver: ApiServer, namespace: str) -> None:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "compute", "namespace": namespace},
        "spec": {"hard": {"pods": "0"}},
    }
    apiserver.apply(quota)
    status = '{"status": {"hard": {"pods": "0"}, "used": {"pods": "0"}}}'
    apiserver.kubectl(
        "patch", "resourcequota", "compute", "-n", namespace, "--subresource=status",
        "--type=merge", "-p", status,
    )  # fmt: skip


def dead_kubeconfig(near: Path) -> Path:
    """``near`` with its server moved to a port nothing listens on."""
    import socket  # noqa: PLC0415 - only this helper needs it

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    text = near.read_text()
    server = text.split("server: ", 1)[1].split("\n", 1)[0]
    path = near.parent / f"dead.{port}.kubeconfig"
    path.write_text(text.replace(server, f"https://127.0.0.1:{port}"))
    return path


# ----------------------------------------------------------------------------- beyond the contract


async def test_real_refusals_land_in_the_right_class(
    provoke: Provoke,
) -> None:
    expected = {
        "422 invalid pod": (Permanent, "HTTP 422 Invalid: .*must be less than or equal to"),
        "403 exceeded quota": (QuotaExceeded, "HTTP 403 Forbidden: .*exceeded quota: compute"),
        "403 forbidden": (Permanent, "HTTP 403 Forbidden: .*cannot create resource"),
        "404 namespace on create": (Permanent, "HTTP 404 NotFound: .*not found"),
        "connection refused": (Transient, "no answer"),
    }
    assert [label for label, _ in provoke] == list(expected)
    for label, call in provoke:
        cls, pattern = expected[label]
        with pytest.raises(cls, match=pattern):
            await call()


async def test_a_bound_pod_stays_terminating_until_its_kubelet_lets_go(
    setup: Setup, provider: KubernetesProvider, make_request: MakeRequest
) -> None:
    contract = ProviderContract()
    request = make_request("grace")
    first = await contract.running(provider, await provider.create(request))
    setup.kubelet.paused = True  # the containers take their time to stop
    await provider.delete(first.provider_id)
    assert (await provider.get(first.provider_id)).state is InstanceState.TERMINATING
    await provider.delete(first.provider_id)  # idempotent while terminating
    with pytest.raises(Transient, match="still being deleted"):
        await provider.create(request)
    setup.kubelet.paused = False
    await contract.gone(provider, first.provider_id)
    second = await contract.running(provider, await provider.create(request))
    assert second.instance_uid != first.instance_uid
