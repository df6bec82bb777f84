"""The watcher's few Kubernetes API calls, with errors in our hierarchy (``KubeApiError``).

Custom objects come back as plain dicts (no generated models), which is what the pure code in
``objects`` and ``status`` reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import Any, cast

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from events.resource import API_VERSION, GROUP, KIND, PLURAL, VERSION
from services.runtime.kubeclient import (
    KubeApiError,
    KubeConflict,
    KubeNotFound,
    KubeUnavailable,
    classify_api_error,
)
from services.watcher.pure.objects import CLOUD_INIT_LABEL, ProxyObject
from services.watcher.pure.status import COMPONENT, Notice, rfc3339

MERGE_PATCH = "application/merge-patch+json"
# The generated client would pick json-patch for a dict body; its stubs omit the override.
_MERGE: dict[str, Any] = {"_content_type": MERGE_PATCH}
Raw = dict[str, Any]


def _wrap(exc: Exception, what: str) -> KubeApiError:
    if isinstance(exc, ApiException):
        return classify_api_error(exc, what)
    return KubeUnavailable(f"{what}: {type(exc).__name__}: {exc}")


class ProxyApi:
    def __init__(self, api_client: k8s.ApiClient, *, request_timeout: float = 30.0) -> None:
        self.api_client = api_client
        self.custom = k8s.CustomObjectsApi(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.timeout = request_timeout

    async def list_proxies(self) -> tuple[list[Raw], str]:
        """Every Proxy in the cluster and the list's resourceVersion (where a watch resumes)."""
        try:
            listing = await self.custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, _request_timeout=self.timeout
            )
        except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
            raise _wrap(exc, "list proxies") from exc
        return list(listing.get("items") or []), str(listing["metadata"]["resourceVersion"])

    async def watch_proxies(self, resource_version: str) -> AsyncGenerator[Raw, None]:
        """Watch events from ``resource_version`` on, bookmarks included.

        kubernetes_asyncio's ``Watch`` resumes a dropped connection from the latest
        resourceVersion it saw (bookmarks count); what it cannot resume (410 Gone) is raised as
        ``KubeGone`` for the caller to list again.
        """
        async with Watch() as watch:
            stream = watch.stream(
                self.custom.list_cluster_custom_object,
                GROUP,
                VERSION,
                PLURAL,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
            )
            try:
                async for event in stream:
                    yield event
            except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
                raise _wrap(exc, "watch proxies") from exc

    async def watch_secrets(self) -> AsyncGenerator[Raw, None]:
        """Labelled Secrets (the only ones usable as cloud-init), from now on."""
        async with Watch() as watch:
            stream = watch.stream(
                self.core.list_secret_for_all_namespaces,
                label_selector=f"{CLOUD_INIT_LABEL}=true",
                allow_watch_bookmarks=True,
            )
            try:
                async for event in stream:
                    yield event
            except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
                raise _wrap(exc, "watch secrets") from exc

    async def read_secret(self, namespace: str, name: str) -> Raw | None:
        try:
            secret = await self.core.read_namespaced_secret(
                name, namespace, _request_timeout=self.timeout
            )
        except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
            error = _wrap(exc, f"read Secret {namespace}/{name}")
            if isinstance(error, KubeNotFound):
                return None
            raise error from exc
        data: Raw = self.api_client.sanitize_for_serialization(secret)
        return data

    async def get_proxy(self, namespace: str, name: str) -> Raw | None:
        try:
            result: Raw = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=self.timeout
            )
        except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
            error = _wrap(exc, f"get Proxy {namespace}/{name}")
            if isinstance(error, KubeNotFound):
                return None
            raise error from exc
        return result

    async def set_finalizers(self, obj: ProxyObject, finalizers: list[str]) -> Raw | None:
        """Replace the finalizer list, guarded by the resourceVersion we decided on: a 409 means
        the object moved, and its next watch event brings the decision back. None: it is gone."""
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version}}
        try:
            result: Raw = await self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                obj.namespace,
                PLURAL,
                obj.name,
                body,
                **_MERGE,
                _request_timeout=self.timeout,
            )
        except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
            error = _wrap(exc, f"set finalizers of Proxy {obj.namespace}/{obj.name}")
            if isinstance(error, KubeNotFound | KubeConflict):
                return None
            raise error from exc
        return result

    async def patch_status(self, namespace: str, name: str, status: Raw) -> bool:
        """Merge-patch ``.status`` through the status subresource; False: the object is gone."""
        try:
            await self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": status},
                **_MERGE,
                _request_timeout=self.timeout,
            )
        except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
            error = _wrap(exc, f"patch status of Proxy {namespace}/{name}")
            if isinstance(error, KubeNotFound):
                return False
            raise error from exc
        return True

    async def record_event(self, obj: ProxyObject, notice: Notice, cause: str) -> None:
        """One core/v1 Event per transition; its name derives from the transition (``cause``),
        so two writers recording the same one meet at a 409 and the second is dropped."""
        digest = hashlib.blake2b(f"{obj.uid}/{cause}/{notice.reason}".encode(), digest_size=8)
        now = rfc3339(datetime.now(UTC))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{obj.name}.{digest.hexdigest()}", "namespace": obj.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": obj.name,
                "namespace": obj.namespace,
                "uid": obj.uid,
            },
            "type": notice.type,
            "reason": notice.reason,
            "message": notice.message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.core.create_namespaced_event(
                obj.namespace, cast(Any, body), _request_timeout=self.timeout
            )
        except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
            error = _wrap(exc, f"record event for Proxy {obj.namespace}/{obj.name}")
            if isinstance(error, KubeConflict):
                return
            raise error from exc
