"""The test apiserver (tests.support.kube) behaves as its docstring promises, through
kubernetes_asyncio over real HTTP: the watcher's and the provider's tests rely on each point."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import watch

from services.runtime.kube.client import new_api_client
from tests.support.kube import LEASES, PROXIES, KubeCluster, start_kube

pytestmark = pytest.mark.integration

G, V, P = "crawl.example.com", "v1alpha1", "proxies"
MERGE = "application/merge-patch+json"


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[KubeCluster]:
    async with start_kube(tmp_path, bookmark_interval=0.1) as cluster:
        yield cluster


@pytest.fixture
async def api_client(kube: KubeCluster) -> AsyncIterator[k8s.ApiClient]:
    client = await new_api_client(kube.settings)
    async with client:
        yield client


@pytest.fixture
def api(api_client: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api_client)


def proxy(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "Proxy",
        "metadata": {"name": name, "labels": labels},
        "spec": {"provider": "k8s"},
    }


async def create(api: k8s.CustomObjectsApi, name: str, **labels: str) -> dict[str, Any]:
    obj: dict[str, Any] = await api.create_namespaced_custom_object(
        G, V, "default", P, proxy(name, **labels)
    )
    return obj


async def patch(
    api: k8s.CustomObjectsApi, name: str, body: Any, *, status: bool = False
) -> dict[str, Any]:
    call = (
        api.patch_namespaced_custom_object_status if status else api.patch_namespaced_custom_object
    )
    # The generated stubs omit the override the client accepts.
    kind: dict[str, Any] = {
        "_content_type": MERGE if isinstance(body, dict) else "application/json-patch+json"
    }
    result: dict[str, Any] = await call(G, V, "default", P, name, body, **kind)
    return result


async def test_metadata_generation_and_the_status_subresource(
    api: k8s.CustomObjectsApi,
) -> None:
    created = await create(api, "a")
    meta = created["metadata"]
    assert meta["uid"]
    assert meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1
    rv = int(meta["resourceVersion"])
    with_status = await patch(
        api, "a", {"status": {"phase": "Ready"}, "spec": {"provider": "x"}}, status=True
    )
    assert with_status["status"] == {"phase": "Ready"}
    assert with_status["spec"]["provider"] == "k8s"  # /status writes only status
    assert with_status["metadata"]["generation"] == 1
    assert int(with_status["metadata"]["resourceVersion"]) > rv
    edited = await patch(api, "a", {"spec": {"provider": "other"}, "status": {"phase": "X"}})
    assert edited["metadata"]["generation"] == 2
    assert edited["status"] == {"phase": "Ready"}  # the main resource ignores status
    same = await patch(api, "a", {"spec": {"provider": "other"}})
    assert same["metadata"]["resourceVersion"] == edited["metadata"]["resourceVersion"]
    with pytest.raises(k8s.ApiException) as caught:
        await create(api, "a")
    assert caught.value.status == 409


async def test_preconditions_conflict(
    api: k8s.CustomObjectsApi, api_client: k8s.ApiClient, kube: KubeCluster
) -> None:
    created = await create(api, "b")
    stale = created["metadata"]["resourceVersion"]
    await patch(api, "b", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(k8s.ApiException) as caught:
        await patch(api, "b", {"metadata": {"resourceVersion": stale, "labels": {"x": "2"}}})
    assert caught.value.status == 409
    with pytest.raises(k8s.ApiException) as caught:
        await patch(api, "b", [{"op": "test", "path": "/metadata/labels/x", "value": "2"}])
    assert caught.value.status == 422
    # PUT (how leader election renews its Lease) checks the resourceVersion too.
    lease = kube.create(LEASES, {"metadata": {"name": "w"}, "spec": {"holderIdentity": "a"}})
    coordination = k8s.CoordinationV1Api(api_client)
    body: Any = dict(lease, spec={"holderIdentity": "b"})
    renewed = await coordination.replace_namespaced_lease("w", "default", body)
    assert renewed.spec.holder_identity == "b"
    with pytest.raises(k8s.ApiException) as caught:
        await coordination.replace_namespaced_lease("w", "default", body)
    assert caught.value.status == 409


async def test_label_selectors(api: k8s.CustomObjectsApi) -> None:
    await create(api, "c1", tier="gold", zone="a")
    await create(api, "c2", tier="silver")
    await create(api, "c3")

    async def names(selector: str) -> list[str]:
        found = await api.list_namespaced_custom_object(G, V, "default", P, label_selector=selector)
        return sorted(item["metadata"]["name"] for item in found["items"])

    assert await names("tier=gold") == ["c1"]
    assert await names("tier!=gold") == ["c2", "c3"]
    assert await names("tier") == ["c1", "c2"]
    assert await names("!tier") == ["c3"]
    assert await names("tier in (gold,silver),!zone") == ["c2"]


async def test_finalizers_hold_deletion(api: k8s.CustomObjectsApi, kube: KubeCluster) -> None:
    await create(api, "d")
    await patch(api, "d", {"metadata": {"finalizers": ["crawl.example.com/finalizer"]}})
    await api.delete_namespaced_custom_object(G, V, "default", P, "d")
    held = kube.get(PROXIES, "default", "d")
    assert held is not None
    assert held["metadata"]["deletionTimestamp"]
    await patch(api, "d", {"metadata": {"finalizers": None}})
    assert kube.get(PROXIES, "default", "d") is None


async def collect(stream: Any, count: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async for event in stream:
        events.append(event)
        if len(events) == count:
            break
    return events


async def test_watch_resumes_from_a_resource_version_with_bookmarks(
    api: k8s.CustomObjectsApi, kube: KubeCluster
) -> None:
    await create(api, "e1")
    listed = await api.list_namespaced_custom_object(G, V, "default", P)
    since = listed["metadata"]["resourceVersion"]
    await create(api, "e2")
    kube.patch(PROXIES, "default", "e1", {"spec": {"provider": "z"}})
    w = watch.Watch()
    events = await asyncio.wait_for(
        collect(
            w.stream(
                api.list_namespaced_custom_object,
                G,
                V,
                "default",
                P,
                resource_version=since,
                allow_watch_bookmarks=True,
            ),
            3,
        ),
        timeout=10,
    )
    await w.close()
    assert [(e["type"], e["raw_object"]["metadata"].get("name")) for e in events] == [
        ("ADDED", "e2"),
        ("MODIFIED", "e1"),
        ("BOOKMARK", None),
    ]
    assert events[2]["raw_object"]["metadata"]["resourceVersion"] == str(kube.revision)


async def test_a_compacted_resource_version_is_410(
    api: k8s.CustomObjectsApi, kube: KubeCluster
) -> None:
    created = await create(api, "f")
    kube.compact()
    stream = watch.Watch().stream(
        api.list_namespaced_custom_object,
        G,
        V,
        "default",
        P,
        resource_version=created["metadata"]["resourceVersion"],
        timeout_seconds=5,
    )
    with pytest.raises(k8s.ApiException) as caught:
        await collect(stream, 1)
    assert caught.value.status == 410


async def test_open_watches_can_be_ended_with_410(
    api: k8s.CustomObjectsApi, kube: KubeCluster
) -> None:
    await create(api, "g")
    stream = watch.Watch().stream(
        api.list_namespaced_custom_object, G, V, "default", P, timeout_seconds=30
    )
    first = await asyncio.wait_for(collect(stream, 1), timeout=10)
    assert first[0]["type"] == "ADDED"
    assert kube.server.open_watches == 1
    kube.end_watches(gone=True)
    with pytest.raises(k8s.ApiException) as caught:
        await asyncio.wait_for(collect(stream, 1), timeout=10)
    assert caught.value.status == 410


async def test_faults_answer_before_anything_changes(
    api: k8s.CustomObjectsApi, kube: KubeCluster
) -> None:
    kube.fail("create", PROXIES, status=500, times=1)
    with pytest.raises(k8s.ApiException) as caught:
        await create(api, "h")
    assert caught.value.status == 500
    assert kube.get(PROXIES, "default", "h") is None
    await create(api, "h")
    assert kube.get(PROXIES, "default", "h") is not None


async def test_defaulting_of_secrets_and_pods(api_client: k8s.ApiClient, kube: KubeCluster) -> None:
    core = k8s.CoreV1Api(api_client)
    body: Any = {"metadata": {"name": "s"}, "stringData": {"userdata": "#cloud-config\n"}}
    await core.create_namespaced_secret("default", body)
    secret = await core.read_namespaced_secret("s", "default")
    assert secret.data == {"userdata": "I2Nsb3VkLWNvbmZpZwo="}
    assert secret.string_data is None
    pod: Any = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    created = await core.create_namespaced_pod("default", pod)
    assert created.status.phase == "Pending"
