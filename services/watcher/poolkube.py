"""The watcher's Kubernetes API calls for ProxyPools and for the Proxy objects that mirror their
members, with errors in our hierarchy (``KubeApiError``), as ``kube`` does for Proxies.

Every call names its resource by its plural (``POOL_PLURAL`` or ``PLURAL``): the RBAC test in
tests/unit/test_deploy.py reads that name to derive the rules the watcher needs.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, cast

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from events.poolresource import PLURAL as POOL_PLURAL
from events.resource import GROUP, PLURAL, VERSION
from services.runtime.kubeclient import KubeApiError, KubeConflict, KubeNotFound
from services.watcher.kube import _MERGE, Raw, _wrap
from services.watcher.pure.pools import PoolObject


class PoolApi:
    def __init__(self, api_client: k8s.ApiClient, *, request_timeout: float = 30.0) -> None:
        self.custom = k8s.CustomObjectsApi(api_client)
        self.timeout = request_timeout

    # ------------------------------------------------------------------------- ProxyPools

    async def list_pools(self) -> tuple[list[Raw], str]:
        try:
            listing = await self.custom.list_cluster_custom_object(
                GROUP, VERSION, POOL_PLURAL, _request_timeout=self.timeout
            )
        except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
            raise _wrap(exc, "list proxypools") from exc
        return list(listing.get("items") or []), str(listing["metadata"]["resourceVersion"])

    async def watch_pools(self, resource_version: str) -> AsyncGenerator[Raw, None]:
        """Watch events from ``resource_version`` on; 410 Gone is raised as ``KubeGone``."""
        async with Watch() as watch:
            stream = watch.stream(
                self.custom.list_cluster_custom_object,
                GROUP,
                VERSION,
                POOL_PLURAL,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
            )
            try:
                async for event in stream:
                    yield event
            except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
                raise _wrap(exc, "watch proxypools") from exc

    async def get_pool(self, namespace: str, name: str) -> Raw | None:
        try:
            result: Raw = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, POOL_PLURAL, name, _request_timeout=self.timeout
            )
        except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
            error = _wrap(exc, f"get ProxyPool {namespace}/{name}")
            if isinstance(error, KubeNotFound):
                return None
            raise error from exc
        return result

    async def set_pool_finalizers(self, obj: PoolObject, finalizers: list[str]) -> Raw | None:
        """Replace the finalizers, guarded by the resourceVersion decided on; None: the object
        moved (409) or is gone, and its next watch event brings the decision back."""
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version}}
        try:
            result: Raw = await self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                obj.namespace,
                POOL_PLURAL,
                obj.name,
                body,
                **_MERGE,
                _request_timeout=self.timeout,
            )
        except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
            error = _wrap(exc, f"set finalizers of ProxyPool {obj.namespace}/{obj.name}")
            if isinstance(error, KubeNotFound | KubeConflict):
                return None
            raise error from exc
        return result

    async def patch_pool_status(self, namespace: str, name: str, status: Raw) -> bool:
        """Merge-patch ``.status`` through the status subresource; False: the object is gone."""
        try:
            await self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                POOL_PLURAL,
                name,
                {"status": status},
                **_MERGE,
                _request_timeout=self.timeout,
            )
        except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
            error = _wrap(exc, f"patch status of ProxyPool {namespace}/{name}")
            if isinstance(error, KubeNotFound):
                return False
            raise error from exc
        return True

    # ------------------------------------------------------------------------- mirrors

    async def create_mirror(self, namespace: str, body: Raw) -> Raw | None:
        """Create a member's mirror; None if an object of that name exists already (409)."""
        try:
            result: Raw = await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, body, _request_timeout=self.timeout
            )
        except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
            name = (body.get("metadata") or {}).get("name")
            error = _wrap(exc, f"create Proxy {namespace}/{name}")
            if isinstance(error, KubeConflict):
                return None
            raise error from exc
        return result

    async def patch_mirror(self, namespace: str, name: str, patch: Raw) -> Raw | None:
        """Put a mirror back (a merge patch); None: it is gone."""
        try:
            result: Raw = await self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                patch,
                **_MERGE,
                _request_timeout=self.timeout,
            )
        except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
            error = _wrap(exc, f"patch Proxy {namespace}/{name}")
            if isinstance(error, KubeNotFound):
                return None
            raise error from exc
        return result

    async def delete_mirror(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the mirror with this uid (a precondition: never an object re-created under
        the name meanwhile); False: it is gone already, or is another object now."""
        body: dict[str, Any] = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            await self.custom.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body=cast(Any, body),
                _request_timeout=self.timeout,
            )
        except (ApiException, aiohttp.ClientError, TimeoutError) as exc:
            error: KubeApiError = _wrap(exc, f"delete Proxy {namespace}/{name}")
            if isinstance(error, KubeNotFound | KubeConflict):
                return False
            raise error from exc
        return True
