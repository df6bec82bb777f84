"""The four contract calls as Kubernetes pod operations (kubernetes_asyncio, typed CoreV1Api).

The provider id is ``<namespace>/<pod name>``, so get and delete need nothing but the id. The
pod name is the reconciler's deterministic instance name, which makes create idempotent through
the apiserver itself: a second create gets 409 and answers with the existing pod, provided it
belongs to the same Proxy (a pod of another owner under that name is a Permanent error, never
silently adopted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from events.schemas import InstanceState
from services.providers.base import (
    CreateRequest,
    Instance,
    NotFound,
    Permanent,
    ProviderError,
    Transient,
)
from services.providers.kubernetes.config import KubernetesConfig
from services.providers.kubernetes.pure.classify import error_for
from services.providers.kubernetes.pure.mapping import (
    K8S_MANAGED,
    build_pod,
    instance_of,
    parse_provider_id,
    provider_id,
    selector,
)
from services.runtime.kube.client import (
    KubeSettings,
    Sources,
    kubeconfig_path,
    new_api_client,
    status_message,
)
from services.runtime.settings.errors import ConfigError

T = TypeVar("T")
SOURCES = Sources(kubeconfig="kubernetes.kubeconfig", context="kubernetes.context")


class KubernetesProvider:
    type = "kubernetes"

    def __init__(self, name: str, config: KubernetesConfig) -> None:
        self.name = name
        self.config = config
        self._settings = KubeSettings(kubeconfig=config.kubeconfig, context=config.context)
        self._api: k8s.ApiClient | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_config(cls, name: str, config: KubernetesConfig) -> KubernetesProvider:
        """Checks where the cluster is now (a missing kubeconfig stops start-up); connects on
        first use, since constructors do no network I/O."""
        settings = KubeSettings(kubeconfig=config.kubeconfig, context=config.context)
        kubeconfig_path(settings, sources=SOURCES)
        return cls(name, config)

    async def _core(self) -> k8s.CoreV1Api:
        async with self._lock:
            if self._api is None:
                try:
                    self._api = await new_api_client(self._settings, sources=SOURCES)
                except ConfigError as exc:
                    raise Permanent(f"{self.name}: cannot reach the cluster: {exc}") from exc
        return k8s.CoreV1Api(self._api)

    async def _call(self, call: Awaitable[T], *, op: str, what: str) -> T:
        """``call``'s result, or its failure in the taxonomy (the original chained)."""
        try:
            return await call
        except ApiException as exc:
            reason, message = status_message(exc)
            raise error_for(int(exc.status or 0), reason, message, op=op, what=what) from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Transient(f"{what}: no answer from the cluster: {exc!r}") from exc

    def _dict(self, obj: object) -> dict[str, Any]:
        assert self._api is not None
        data: dict[str, Any] = self._api.sanitize_for_serialization(obj)
        return data

    # ---------------------------------------------------------------- Provider

    async def create(self, request: CreateRequest) -> str:
        core = await self._core()
        pod = build_pod(request, self.config, self.name, datetime.now(UTC))
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        what = f"{self.name}: create pod {namespace}/{name}"
        try:
            await self._call(
                core.create_namespaced_pod(
                    namespace,
                    # The client serialises a dict as it is: the manifest stays one plain,
                    # unit-tested structure instead of a tree of generated model classes.
                    cast("k8s.V1Pod", pod),
                    _request_timeout=self.config.timeout_seconds,
                ),
                op="create",
                what=what,
            )
        except Transient as exc:
            if not _is_conflict(exc):
                raise
            return await self._existing(namespace, name, request)
        return provider_id(namespace, name)

    async def _existing(self, namespace: str, name: str, request: CreateRequest) -> str:
        """The pod a 409 says exists: ours to return only if it is this Proxy's."""
        try:
            instance = await self.get(provider_id(namespace, name))
        except NotFound as exc:
            raise Transient(
                f"{self.name}: pod {namespace}/{name} existed a moment ago and is gone; "
                "create again"
            ) from exc
        if instance.owner_uid != request.owner_uid or instance.name != request.name:
            raise Permanent(
                f"{self.name}: pod {namespace}/{name} exists but belongs to "
                f"{instance.owner_uid or 'someone else'} ({instance.name}); delete it or rename"
            )
        if instance.state is InstanceState.TERMINATING:
            # The previous pod of this name is still shutting down; a new one can follow it.
            raise Transient(f"{self.name}: pod {namespace}/{name} is still being deleted")
        return instance.provider_id

    async def get(self, provider_id: str) -> Instance:
        parsed = parse_provider_id(provider_id)
        if parsed is None:
            raise NotFound(f"{self.name}: {provider_id!r} is no pod this provider created")
        namespace, name = parsed
        core = await self._core()
        pod = await self._call(
            core.read_namespaced_pod(name, namespace, _request_timeout=self.config.timeout_seconds),
            op="get",
            what=f"{self.name}: get pod {provider_id}",
        )
        found = self._dict(pod)
        if (found.get("metadata", {}).get("labels") or {}).get(K8S_MANAGED) != "true":
            raise NotFound(f"{self.name}: pod {provider_id} exists but is not managed by us")
        return instance_of(found, self.config.port, datetime.now(UTC))

    async def delete(self, provider_id: str) -> None:
        parsed = parse_provider_id(provider_id)
        if parsed is None:
            return
        namespace, name = parsed
        core = await self._core()
        try:
            await self._call(
                core.delete_namespaced_pod(
                    name,
                    namespace,
                    grace_period_seconds=self.config.delete_grace_seconds,
                    _request_timeout=self.config.timeout_seconds,
                ),
                op="delete",
                what=f"{self.name}: delete pod {provider_id}",
            )
        except NotFound:
            return

    async def list_by_tag(self) -> list[Instance]:
        core = await self._core()
        pods = await self._call(
            core.list_pod_for_all_namespaces(
                label_selector=selector(self.name), _request_timeout=self.config.timeout_seconds
            ),
            op="list",
            what=f"{self.name}: list pods",
        )
        found = self._dict(pods)
        now = datetime.now(UTC)
        return [instance_of(pod, self.config.port, now) for pod in found.get("items") or []]

    async def close(self) -> None:
        async with self._lock:
            api, self._api = self._api, None
        if api is not None:
            await api.close()


def _is_conflict(exc: ProviderError) -> bool:
    cause = exc.__cause__
    return isinstance(cause, ApiException) and cause.status == 409


# KubernetesConfig is looked up here by the providers registry (PROVIDER_TYPES).
__all__ = ["KubernetesConfig", "KubernetesProvider"]
