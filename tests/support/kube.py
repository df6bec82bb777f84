"""A Kubernetes API server for tests: kmock's scaffold with a realistic object store, on a port.

``async with start_kube(tmp_path) as kube:`` starts the server, writes a kubeconfig pointing at it
and yields a ``KubeCluster``: ``kube.settings`` (``KubeSettings`` for ``new_api_client``) plus
server-side access to the objects. Clients talk real HTTP through kubernetes_asyncio.

kmock 0.8's own ``KubernetesEmulator`` has none of the apiserver behaviour controllers rely on
(no resourceVersion, uid or generation; every watch replays everything; no bookmarks, 410, label
selectors, PUT or status subresource), so only its scaffold (HTTP server, discovery, Status errors,
request log, DSL) is used. What the emulation adds (``tests.support.kube_emulator``;
tests/integration/test_kube_support.py checks it):
- Resources must be registered (``RESOURCES`` below are by default: proxies.crawl.example.com/
  v1alpha1 with the status subresource, v1 pods/secrets/events/configmaps, events.k8s.io/v1
  events, coordination.k8s.io/v1 leases); others answer 404 like an unknown CRD.
- create (POST): uid, creationTimestamp, generation 1, resourceVersion; 409 AlreadyExists;
  ``generateName``; status is dropped on create where the status subresource is on (proxies,
  pods). Defaulting: a pod starts with ``status.phase: Pending``; a Secret's ``stringData`` is
  stored base64-encoded in ``data`` (and never returned), as on a real apiserver.
- get / list (``labelSelector`` with =, ==, !=, exists, !exists, in, notin; ``fieldSelector``
  ``metadata.name=`` only) / delete; the list's ``metadata.resourceVersion`` is current.
- update (PUT, e.g. leader-election Leases) with ``metadata.resourceVersion`` → 409 Conflict when
  stale; patch with merge-patch, strategic-merge-patch (treated as a merge patch: lists are
  replaced whole) and json-patch (RFC 6902, ``test`` included → 422 when it fails); a merge patch
  carrying ``metadata.resourceVersion`` is conditional (409 when stale). apply-patch → 415.
- status subresource: writes to ``/status`` change only ``.status``; writes to the main resource
  ignore ``.status``. ``metadata.generation`` grows only when something outside metadata/status
  changes. A write that changes nothing stores nothing (no new resourceVersion, no event).
- finalizers: delete with finalizers sets ``deletionTimestamp`` (MODIFIED event); removing the last
  finalizer then deletes (DELETED). Delete without finalizers is immediate (no grace period:
  pods vanish at once; there is no kubelet, tests play it: see ``KubeCluster.patch``).
- watch: ``resourceVersion`` empty/"0" → ADDED for every current object, then changes; a given
  resourceVersion → only changes after it (replayed from history); below the compaction floor
  (``kube.compact()``) → an ``ERROR`` event with a 410 Status (kubernetes_asyncio raises
  ApiException(410)). ``allowWatchBookmarks=true`` → a BOOKMARK every ``bookmark_interval``
  seconds carrying the latest resourceVersion; ``timeoutSeconds`` ends the stream;
  ``kube.end_watches(gone=False|True)`` ends every open stream (optionally with a 410 first).
- faults: ``kube.fail(verb, resource, status=..., name=..., times=..., delay=...)`` answers
  matching requests with a Kubernetes Status error before any state changes.
Not emulated: DeleteOptions (grace period, preconditions, propagation: ignored), namespaces as
objects, admission, other defaulting, OpenAPI validation (our CRD schema is
checked by tests/unit/test_crd.py instead), deleteCollection, server-side apply, pagination
(``limit``/``continue`` are ignored: everything comes in one page), pod lifecycle (no kubelet).
kmock's DSL still works on ``kube.server`` (scripted reactions win over the emulation) and
iterating ``kube.server`` (or ``kube.requests()``) gives every request received.
kubernetes_asyncio sends a dict body to ``patch_*_custom_object*`` as a JSON patch unless told
otherwise: pass ``_content_type="application/merge-patch+json"`` (the emulator, like a real
apiserver, answers 400 to a JSON patch that is not a list).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kmock
import yaml

from services.runtime.kube.client import KubeSettings
from tests.support.kube_emulator import ApiServerEmulator, Fault, Obj, ResourceType
from tests.support.kube_patch import merge_patch

PROXIES = "crawl.example.com/v1alpha1/proxies"
PODS = "v1/pods"
SECRETS = "v1/secrets"
EVENTS = "v1/events"
CONFIGMAPS = "v1/configmaps"
NEW_EVENTS = "events.k8s.io/v1/events"
LEASES = "coordination.k8s.io/v1/leases"

RESOURCES = (
    ResourceType("crawl.example.com", "v1alpha1", "proxies", "Proxy", status_subresource=True),
    ResourceType("", "v1", "pods", "Pod", status_subresource=True),
    ResourceType("", "v1", "secrets", "Secret"),
    ResourceType("", "v1", "events", "Event"),
    ResourceType("", "v1", "configmaps", "ConfigMap"),
    ResourceType("events.k8s.io", "v1", "events", "Event"),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
)


@dataclass
class KubeCluster:
    """The test's side of the server: settings for clients, and the objects behind the API.

    Server-side changes go through the same code as API writes, so they bump resourceVersions and
    reach open watches, as another client's writes would.
    """

    settings: KubeSettings
    server: ApiServerEmulator
    url: str

    def register(self, rtype: ResourceType) -> None:
        self.server.register(rtype)

    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        rtype = self.server.type_of(resource)
        obj = self.server.store.get((resource, namespace if rtype.namespaced else "", name))
        return copy.deepcopy(obj) if obj is not None else None

    def list_objects(self, resource: str, namespace: str | None = None) -> list[Obj]:
        return [
            copy.deepcopy(obj)
            for (res, ns, _), obj in sorted(self.server.store.items())
            if res == resource and (namespace is None or ns == namespace)
        ]

    def create(self, resource: str, obj: Obj, namespace: str = "default") -> Obj:
        return copy.deepcopy(
            self.server.create_object(self.server.type_of(resource), namespace, obj)
        )

    def patch(
        self, resource: str, namespace: str, name: str, patch: Obj, *, status: bool = False
    ) -> Obj:
        """A merge patch, as a controller (or, for pods, the kubelet) would send it."""
        rtype = self.server.type_of(resource)
        key = (resource, namespace if rtype.namespaced else "", name)
        old = self.server.store.get(key)
        if old is None:
            raise KeyError(f"{resource} {namespace}/{name} does not exist")
        return copy.deepcopy(
            self.server.update_object(rtype, key, merge_patch(old, patch), status=status)
        )

    def delete(self, resource: str, namespace: str, name: str) -> Obj:
        rtype = self.server.type_of(resource)
        key = (resource, namespace if rtype.namespaced else "", name)
        return copy.deepcopy(self.server.delete_object(rtype, key))

    def fail(
        self,
        verb: str,
        resource: str,
        *,
        status: int,
        reason: str = "",
        message: str = "",
        namespace: str | None = None,
        name: str | None = None,
        times: int | None = None,
        delay: float = 0.0,
        headers: dict[str, str] | None = None,
    ) -> Fault:
        """Answer matching requests with an error; ``verb`` is get/list/watch/create/update/
        patch/delete or ``*`` (``patch/status``: the status subresource only), ``resource`` a
        registered key or ``*``; ``times=None``: forever; ``headers`` go with the error."""
        fault = Fault(
            verb,
            resource,
            namespace,
            name,
            status,
            reason or _REASONS.get(status, "InternalError"),
            message or f"injected by the test ({status})",
            times,
            delay,
            headers=dict(headers or {}),
        )
        self.server.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        self.server.faults.clear()

    def compact(self) -> None:
        """Make every resourceVersion seen so far too old to watch from (410 Gone)."""
        self.server.compact()

    def end_watches(self, *, gone: bool = False) -> None:
        self.server.end_watches(gone=gone)

    @property
    def revision(self) -> int:
        return self.server.revision

    def requests(self, predicate: Callable[[kmock.Request], bool] | None = None) -> list[Any]:
        return [r for r in self.server if predicate is None or predicate(r)]


_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Gone",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def write_kubeconfig(path: Path, url: str, *, context: str = "kmock") -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "test-token"}}],
        "contexts": [{"name": context, "context": {"cluster": "kmock", "user": "tester"}}],
        "current-context": context,
    }
    path.write_text(yaml.safe_dump(config))
    return path


@asynccontextmanager
async def start_kube(
    tmp_path: Path,
    *,
    resources: tuple[ResourceType, ...] = RESOURCES,
    bookmark_interval: float = 1.0,
) -> AsyncIterator[KubeCluster]:
    server = ApiServerEmulator(bookmark_interval=bookmark_interval)
    for rtype in resources:
        server.register(rtype)
    async with server, kmock.Server(server) as http:
        url = str(http.url).rstrip("/")
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
        try:
            yield KubeCluster(KubeSettings(kubeconfig=str(kubeconfig)), server, url)
        finally:
            # Open watch streams would hold the server's shutdown; end them first.
            server.end_watches()
            await asyncio.sleep(0)
