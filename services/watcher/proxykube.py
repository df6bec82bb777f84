"""The watcher's Kubernetes API calls for Proxies, with errors in our hierarchy (``KubeApiError``):
the calls every custom object has (``customobjects.CustomObjectApi``, built with ``plural=PLURAL``),
and the Proxies' own: the Secrets their cloud-init reads, and the Events their transitions record.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes_asyncio import client as k8s

from events.customresource import API_VERSION
from events.proxyresource import KIND, PLURAL
from services.runtime.kube.client import KubeConflict, KubeNotFound
from services.watcher.customobjects import CustomObjectApi, Raw, answer, watch_stream
from services.watcher.pure.objects import CLOUD_INIT_LABEL, ProxyObject
from services.watcher.pure.status import COMPONENT, Notice, rfc3339


class ProxyApi(CustomObjectApi):
    def __init__(self, api_client: k8s.ApiClient, *, request_timeout: float = 30.0) -> None:
        super().__init__(api_client, plural=PLURAL, kind=KIND, request_timeout=request_timeout)
        self.core = k8s.CoreV1Api(api_client)

    def watch_secrets(self) -> AsyncGenerator[Raw, None]:
        """Labelled Secrets (the only ones usable as cloud-init), from now on."""
        return watch_stream(
            self.core.list_secret_for_all_namespaces,
            label_selector=f"{CLOUD_INIT_LABEL}=true",
            what="watch secrets",
        )

    async def read_secret(self, namespace: str, name: str) -> Raw | None:
        call = self.core.read_namespaced_secret(name, namespace, _request_timeout=self.timeout)
        what = f"read Secret {namespace}/{name}"
        secret = await answer(call, what, absent=(KubeNotFound,))
        if secret is None:
            return None
        data: Raw = self.api_client.sanitize_for_serialization(secret)
        return data

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
        call = self.core.create_namespaced_event(
            obj.namespace, cast(Any, body), _request_timeout=self.timeout
        )
        what = f"record event for Proxy {obj.namespace}/{obj.name}"
        await answer(call, what, absent=(KubeConflict,))
