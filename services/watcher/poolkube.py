"""The watcher's Kubernetes API calls for ProxyPools and for the Proxy objects that mirror their
members, with errors in our hierarchy (``KubeApiError``), as ``proxykube`` does for Proxies.

The pools' own calls are ``customobjects.CustomObjectApi``'s, built with
``plural=POOL_PLURAL``; the mirrors' calls name theirs, ``PLURAL``: the RBAC test in
tests/unit/test_deploy.py reads these names to derive the rules the watcher needs.
"""

from __future__ import annotations

from typing import Any, cast

from kubernetes_asyncio import client as k8s

from events.customresource import GROUP, VERSION
from events.poolresource import KIND as POOL_KIND
from events.poolresource import PLURAL as POOL_PLURAL
from events.proxyresource import PLURAL
from services.runtime.kube.client import KubeConflict, KubeNotFound
from services.watcher.customobjects import MERGE, CustomObjectApi, Raw, answer, succeeded


class PoolApi(CustomObjectApi):
    def __init__(self, api_client: k8s.ApiClient, *, request_timeout: float = 30.0) -> None:
        super().__init__(
            api_client, plural=POOL_PLURAL, kind=POOL_KIND, request_timeout=request_timeout
        )

    async def create_mirror(self, namespace: str, body: Raw) -> Raw | None:
        """Create a member's mirror; None if an object of that name exists already (409)."""
        call = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, _request_timeout=self.timeout
        )
        name = (body.get("metadata") or {}).get("name")
        created: Raw | None = await answer(
            call, f"create Proxy {namespace}/{name}", absent=(KubeConflict,)
        )
        return created

    async def patch_mirror(self, namespace: str, name: str, patch: Raw) -> Raw | None:
        """Put a mirror back (a merge patch); None: it is gone."""
        call = self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            patch,
            **MERGE,
            _request_timeout=self.timeout,
        )
        patched: Raw | None = await answer(
            call, f"patch Proxy {namespace}/{name}", absent=(KubeNotFound,)
        )
        return patched

    async def delete_mirror(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the mirror with this uid (a precondition: never an object re-created under
        the name meanwhile); False: it is gone already, or is another object now."""
        body: dict[str, Any] = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        call = self.custom.delete_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            body=cast(Any, body),
            _request_timeout=self.timeout,
        )
        what = f"delete Proxy {namespace}/{name}"
        return await succeeded(call, what, absent=(KubeNotFound, KubeConflict))
