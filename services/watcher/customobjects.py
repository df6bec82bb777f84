"""The watcher's calls on a custom object of ours, whichever its kind (Proxy, ProxyPool), with
errors in our hierarchy (``KubeApiError``): written once, built for a kind by its plural.

Custom objects come back as plain dicts (no generated models), which is what the pure code in
``objects``, ``pools`` and ``status`` reads.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from events.customresource import GROUP, VERSION
from services.runtime.kube.client import (
    KubeApiError,
    KubeConflict,
    KubeNotFound,
    KubeUnavailable,
    classify_api_error,
)
from services.watcher.pure.objects import KubeObject

MERGE_PATCH = "application/merge-patch+json"
# The generated client would pick json-patch for a dict body; its stubs omit the override.
MERGE: dict[str, Any] = {"_content_type": MERGE_PATCH}
Raw = dict[str, Any]


def _wrap(exc: Exception, what: str) -> KubeApiError:
    if isinstance(exc, ApiException):
        return classify_api_error(exc, what)
    return KubeUnavailable(f"{what}: {type(exc).__name__}: {exc}")


T = TypeVar("T")
_FAILURES = (ApiException, aiohttp.ClientError, TimeoutError)
Absent = tuple[type[KubeApiError], ...]
"""The errors that tell a caller the object is not there (any more), or is another one now."""


async def answer(call: Awaitable[T], what: str, *, absent: Absent = ()) -> T | None:
    """The call's answer; None for an error in ``absent``, any other raised as ours."""
    try:
        return await call
    except _FAILURES as exc:
        error = _wrap(exc, what)
        if isinstance(error, absent):
            return None
        raise error from exc


async def succeeded(call: Awaitable[object], what: str, *, absent: Absent = ()) -> bool:
    """Whether the call succeeded; False for an error in ``absent``, any other raised as ours."""
    return await answer(_done(call), what, absent=absent) is not None


async def _done(call: Awaitable[object]) -> bool:
    await call
    return True


async def watch_stream(
    list_call: Callable[..., Any], *args: Any, what: str, **kwargs: Any
) -> AsyncGenerator[Raw, None]:
    """Watch events of ``list_call``, bookmarks included; errors raised as ours.

    kubernetes_asyncio's ``Watch`` resumes a dropped connection from the latest
    resourceVersion it saw (bookmarks count); what it cannot resume (410 Gone) is raised as
    ``KubeGone`` for the caller to list again. (The RBAC test reads ``stream(<list call>`` as a
    watch.)
    """
    async with Watch() as watch:
        stream = watch.stream(list_call, *args, allow_watch_bookmarks=True, **kwargs)
        try:
            async for event in stream:
                yield event
        except _FAILURES as exc:
            raise _wrap(exc, what) from exc


class CustomObjectApi:
    """The calls on one kind of custom object, named by its plural (``kind`` names one in
    errors). The RBAC test in tests/unit/test_deploy.py counts these calls once for each
    ``plural=`` an API is built with."""

    def __init__(
        self, api_client: k8s.ApiClient, *, plural: str, kind: str, request_timeout: float
    ) -> None:
        self.api_client = api_client
        self.custom = k8s.CustomObjectsApi(api_client)
        self.plural = plural
        self.kind = kind
        self.timeout = request_timeout

    async def list_objects(self) -> tuple[list[Raw], str]:
        """Every object in the cluster and the list's resourceVersion (where a watch resumes)."""
        try:
            listing = await self.custom.list_cluster_custom_object(
                GROUP, VERSION, self.plural, _request_timeout=self.timeout
            )
        except _FAILURES as exc:
            raise _wrap(exc, f"list {self.plural}") from exc
        return list(listing.get("items") or []), str(listing["metadata"]["resourceVersion"])

    def watch_objects(self, resource_version: str) -> AsyncGenerator[Raw, None]:
        """Watch events from ``resource_version`` on; 410 Gone is raised as ``KubeGone``."""
        return watch_stream(
            self.custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            self.plural,
            resource_version=resource_version,
            what=f"watch {self.plural}",
        )

    async def get_object(self, namespace: str, name: str) -> Raw | None:
        """None: it is gone."""
        call = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, self.plural, name, _request_timeout=self.timeout
        )
        found: Raw | None = await answer(
            call, f"get {self.kind} {namespace}/{name}", absent=(KubeNotFound,)
        )
        return found

    async def set_finalizers(self, obj: KubeObject, finalizers: list[str]) -> Raw | None:
        """Replace the finalizer list, guarded by the resourceVersion we decided on. None: the
        object moved (409) or is gone, and its next watch event brings the decision back."""
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version}}
        call = self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            obj.namespace,
            self.plural,
            obj.name,
            body,
            **MERGE,
            _request_timeout=self.timeout,
        )
        what = f"set finalizers of {self.kind} {obj.namespace}/{obj.name}"
        updated: Raw | None = await answer(call, what, absent=(KubeNotFound, KubeConflict))
        return updated

    async def patch_status(self, namespace: str, name: str, status: Raw) -> bool:
        """Merge-patch ``.status`` through the status subresource; False: the object is gone."""
        call = self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            self.plural,
            name,
            {"status": status},
            **MERGE,
            _request_timeout=self.timeout,
        )
        what = f"patch status of {self.kind} {namespace}/{name}"
        return await succeeded(call, what, absent=(KubeNotFound,))
