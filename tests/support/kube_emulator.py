"""A stateful Kubernetes API server for tests, built on kmock's Kubernetes scaffold.

kmock 0.8's own ``KubernetesEmulator`` stores objects as plain dicts: no resourceVersion, uid,
generation or creationTimestamp, list resourceVersion ``"..."``, every watch replays everything
from the start, no bookmarks, no 410, no label selectors, no PUT, no status subresource, and it
mutates state even when a test's reaction answers the request. Controllers depend on exactly those
semantics, so this class keeps kmock's HTTP server, request log, discovery, error rendering and
DSL reactions (which win over the emulation: a test can still script any answer), and replaces the
object store with one that behaves like an apiserver in the ways a controller can observe.
See ``tests.support.kube`` for the list of what is and is not emulated.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import attrs
import kmock
from kmock._internal.rendering import Response

from tests.support.kube_patch import apply_json_patch, match_labels, merge_patch
from tests.support.kube_watch import Watch, watch_stream

Key = tuple[str, str, str]  # (resource, namespace or "", name)
Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One served resource: ``group/version/plural`` with what the emulation needs to know."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = False

    @property
    def key(self) -> str:
        return (
            f"{self.group}/{self.version}/{self.plural}"
            if self.group
            else f"{self.version}/{self.plural}"
        )

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclass(slots=True)
class Fault:
    """An injected error: the next ``times`` requests matching it get ``status`` instead."""

    verb: str
    resource: str
    namespace: str | None
    name: str | None
    status: int
    reason: str
    message: str
    times: int | None
    delay: float = 0.0
    hits: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    """Sent with the error (``Retry-After`` on a 429, say)."""
    hit_at: list[float] = field(default_factory=list)
    """The loop time of each request it answered."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _WithHeaders(Exception):
    """A fault whose answer carries headers, which kmock's error rendering cannot send."""

    def __init__(self, fault: Fault) -> None:
        super().__init__(fault.message)
        self.fault = fault


def _error(status: int, reason: str, message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(
        status=status, reason=reason, message=message, details={"causes": []}
    )


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesScaffold):
    """The server side: objects, history for watches, faults. Tests use ``KubeCluster``."""

    bookmark_interval: float = 1.0
    types: dict[str, ResourceType] = attrs.field(factory=dict)
    store: dict[Key, Obj] = attrs.field(factory=dict)
    history: list[tuple[int, str, Obj]] = attrs.field(factory=list)  # (rv, resource, event)
    compacted: int = 0  # watches from a resourceVersion below this get 410 Gone
    faults: list[Fault] = attrs.field(factory=list)
    revision: int = 100
    changed: asyncio.Event = attrs.field(factory=asyncio.Event)
    watches: list[Watch] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # Above kmock's own fallbacks (discovery, 404), below anything a test scripts.
        (self.fallback**1) << self._serve

    # ------------------------------------------------------------------ registration

    def register(self, rtype: ResourceType) -> None:
        self.types[rtype.key] = rtype
        info = self.resources[rtype.key]
        info.kind = rtype.kind
        info.namespaced = rtype.namespaced
        info.verbs = {"get", "list", "watch", "create", "update", "patch", "delete"}
        info.subresources = {"status"} if rtype.status_subresource else set()

    def type_of(self, resource: str) -> ResourceType:
        try:
            return self.types[resource]
        except KeyError:
            raise KeyError(f"{resource!r} is not registered; known: {sorted(self.types)}") from None

    # ------------------------------------------------------------------ state changes

    def _record(self, rtype: ResourceType, kind: str, obj: Obj) -> None:
        self.history.append(
            (
                int(obj["metadata"]["resourceVersion"]),
                rtype.key,
                {"type": kind, "object": copy.deepcopy(obj)},
            )
        )
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    def _bump(self, obj: Obj) -> None:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)

    def create_object(self, rtype: ResourceType, namespace: str, body: Obj) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name") or ""
        if not name:
            raise _error(
                422, "Invalid", "metadata.name: Required value: name or generateName is required"
            )
        ns = namespace if rtype.namespaced else ""
        key = (rtype.key, ns, name)
        if key in self.store:
            raise _error(409, "AlreadyExists", f'{rtype.plural} "{name}" already exists')
        if rtype.namespaced:
            meta["namespace"] = ns
        meta.pop("deletionTimestamp", None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
        if rtype.status_subresource:
            obj.pop("status", None)
        _default(rtype, obj)
        self._bump(obj)
        self.store[key] = obj
        self._record(rtype, "ADDED", obj)
        return obj

    def update_object(
        self, rtype: ResourceType, key: Key, new: Obj, *, status: bool, expected_rv: str = ""
    ) -> Obj:
        """Write ``new`` over the stored object with the apiserver's rules for what may change."""
        old = self.store.get(key)
        if old is None:
            raise _error(404, "NotFound", f'{rtype.plural} "{key[2]}" not found')
        if expected_rv and expected_rv != old["metadata"]["resourceVersion"]:
            raise _error(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rtype.plural} "{key[2]}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )
        result = copy.deepcopy(old)
        if rtype.status_subresource and status:
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
        else:
            keep_status = old.get("status")
            result = copy.deepcopy(new)
            meta, old_meta = result.setdefault("metadata", {}), old["metadata"]
            for fixed in (
                "uid",
                "creationTimestamp",
                "name",
                "namespace",
                "generation",
                "deletionTimestamp",
            ):
                if fixed in old_meta:
                    meta[fixed] = old_meta[fixed]
                else:
                    meta.pop(fixed, None)
            result["apiVersion"], result["kind"] = rtype.api_version, rtype.kind
            if rtype.status_subresource:
                if keep_status is None:
                    result.pop("status", None)
                else:
                    result["status"] = keep_status
            if _spec_of(result) != _spec_of(old):
                meta["generation"] = int(old_meta.get("generation", 1)) + 1
        result["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        _default(rtype, result)
        if result == old:
            return old  # a no-op write stores nothing, as on a real apiserver
        if old["metadata"].get("deletionTimestamp") and not result["metadata"].get("finalizers"):
            return self._remove(rtype, key, result)
        self._bump(result)
        self.store[key] = result
        self._record(rtype, "MODIFIED", result)
        return result

    def delete_object(self, rtype: ResourceType, key: Key) -> Obj:
        obj = self.store.get(key)
        if obj is None:
            raise _error(404, "NotFound", f'{rtype.plural} "{key[2]}" not found')
        if obj["metadata"].get("finalizers"):
            if obj["metadata"].get("deletionTimestamp"):
                return obj
            obj = copy.deepcopy(obj)
            obj["metadata"]["deletionTimestamp"] = _now()
            self._bump(obj)
            self.store[key] = obj
            self._record(rtype, "MODIFIED", obj)
            return obj
        return self._remove(rtype, key, obj)

    def _remove(self, rtype: ResourceType, key: Key, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        self._bump(obj)
        del self.store[key]
        self._record(rtype, "DELETED", obj)
        return obj

    def compact(self) -> None:
        """Forget the watch history: every watch resumed from an older resourceVersion gets 410."""
        self.compacted = self.revision + 1

    def end_watches(self, *, gone: bool = False) -> None:
        """End every open watch (as a server-side timeout would), or with a 410 ERROR event."""
        for watch in self.watches:
            watch.gone = gone
            watch.stop.set()

    @property
    def open_watches(self) -> int:
        return len(self.watches)

    # ------------------------------------------------------------------ serving

    def _fault(
        self,
        verb: str,
        resource: str,
        namespace: str | None,
        name: str | None,
        subresource: str | None = None,
    ) -> Fault | None:
        """The first fault for this request; a fault's verb ``patch/status`` matches only the
        status subresource, ``patch`` both."""
        verbs = {"*", verb, *((f"{verb}/{subresource}",) if subresource else ())}
        for fault in self.faults:
            if fault.times is not None and fault.hits >= fault.times:
                continue
            if fault.verb not in verbs or fault.resource not in ("*", resource):
                continue
            if fault.namespace is not None and fault.namespace != namespace:
                continue
            if fault.name is not None and fault.name != name:
                continue
            fault.hits += 1
            fault.hit_at.append(asyncio.get_running_loop().time())
            return fault
        return None

    async def _serve(self, request: kmock.Request) -> Response:
        """Every answer carries its status: kmock keeps a reaction's last status otherwise."""
        try:
            status, payload = await self._answer(request)
        except _WithHeaders as answer:
            fault = answer.fault
            body = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": fault.message,
                "reason": fault.reason,
                "details": {"causes": []},
                "code": fault.status,
            }
            return Response(status=fault.status, payload=body, headers=fault.headers)
        return Response(status=status, payload=payload)

    async def _answer(self, request: kmock.Request) -> tuple[int, Any]:
        res = request.resource
        if res is None or not res.plural or res.version is None:
            raise NotImplementedError  # discovery and the like: kmock's fallbacks answer
        key = (
            f"{res.group}/{res.version}/{res.plural}"
            if res.group
            else f"{res.version}/{res.plural}"
        )
        rtype = self.types.get(key)
        if rtype is None:
            raise _error(
                404, "NotFound", f"the server could not find the requested resource ({key})"
            )
        params = dict(request.params)
        method = str(
            request.method.value if hasattr(request.method, "value") else request.method
        ).upper()
        watching = params.get("watch", "").lower() in ("true", "1")
        verb = _verb(method, request.name, watching)
        body_name = (
            (request.data or {}).get("metadata", {}).get("name")
            if isinstance(request.data, dict)
            else None
        )
        fault = self._fault(
            verb, key, request.namespace, request.name or body_name, request.subresource
        )
        if fault is not None:
            if fault.delay:
                await asyncio.sleep(fault.delay)
            if fault.headers:
                raise _WithHeaders(fault)
            raise _error(fault.status, fault.reason, fault.message)
        ns = request.namespace or ""
        if verb == "list":
            return 200, self._list(rtype, request.namespace, params)
        if verb == "watch":
            return 200, watch_stream(
                self, rtype, self._select(rtype, request.namespace, params), params
            )
        if verb == "create":
            if not isinstance(request.data, dict):
                raise _error(400, "BadRequest", "the body is not a JSON object")
            return 201, self.create_object(rtype, ns, request.data)
        return 200, self._by_name(request, rtype, verb, ns, method)

    def _by_name(
        self, request: kmock.Request, rtype: ResourceType, verb: str, ns: str, method: str
    ) -> Obj:
        assert request.name is not None
        obj_key = (rtype.key, ns if rtype.namespaced else "", request.name)
        status = request.subresource == "status"
        if verb == "get":
            obj = self.store.get(obj_key)
            if obj is None:
                raise _error(404, "NotFound", f'{rtype.plural} "{request.name}" not found')
            return obj
        if verb == "delete":
            return self.delete_object(rtype, obj_key)
        if verb == "update":
            new = request.data if isinstance(request.data, dict) else {}
            rv = str(new.get("metadata", {}).get("resourceVersion") or "")
            return self.update_object(rtype, obj_key, new, status=status, expected_rv=rv)
        if verb == "patch":
            old = self.store.get(obj_key)
            if old is None:
                raise _error(404, "NotFound", f'{rtype.plural} "{request.name}" not found')
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            if content_type == "application/json-patch+json":
                new = apply_json_patch(old, request.data)
                rv = ""
            elif content_type in (
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
            ):
                if not isinstance(request.data, dict):
                    raise _error(400, "BadRequest", "a merge patch must be a JSON object")
                rv = str((request.data.get("metadata") or {}).get("resourceVersion") or "")
                new = merge_patch(old, request.data)
            else:
                raise _error(
                    415,
                    "UnsupportedMediaType",
                    f"the emulator does not support {content_type!r} patches",
                )
            return self.update_object(rtype, obj_key, new, status=status, expected_rv=rv)
        raise _error(405, "MethodNotAllowed", f"{method} is not supported here")

    def _select(
        self, rtype: ResourceType, namespace: str | None, params: dict[str, str]
    ) -> Callable[[Obj], bool]:
        labels = params.get("labelSelector", "")
        fields = dict(
            part.split("=", 1) for part in params.get("fieldSelector", "").split(",") if "=" in part
        )

        def wanted(obj: Obj) -> bool:
            meta = obj.get("metadata", {})
            if namespace and meta.get("namespace") != namespace:
                return False
            if "metadata.name" in fields and meta.get("name") != fields["metadata.name"]:
                return False
            return match_labels(meta.get("labels") or {}, labels)

        return wanted

    def _list(self, rtype: ResourceType, namespace: str | None, params: dict[str, str]) -> Obj:
        wanted = self._select(rtype, namespace, params)
        items = [
            obj
            for (res, _, _), obj in sorted(self.store.items())
            if res == rtype.key and wanted(obj)
        ]
        return {
            "apiVersion": rtype.api_version,
            "kind": f"{rtype.kind}List",
            "metadata": {"resourceVersion": str(self.revision)},
            "items": items,
        }


def _default(rtype: ResourceType, obj: Obj) -> None:
    """What the apiserver fills in on every write, where tests can observe the difference."""
    if rtype.key == "v1/secrets" and obj.get("stringData"):
        # Write-only: stored base64-encoded in data, never returned.
        data = obj.setdefault("data", {})
        for key, value in obj.pop("stringData").items():
            data[key] = base64.b64encode(str(value).encode()).decode()
    if rtype.key == "v1/pods" and not (obj.get("status") or {}).get("phase"):
        obj.setdefault("status", {})["phase"] = "Pending"


def _verb(method: str, name: str | None, watching: bool) -> str:
    if method == "GET":
        return "watch" if watching else ("get" if name else "list")
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, method.lower()
    )


def _spec_of(obj: Obj) -> Obj:
    """What counts for ``metadata.generation``: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}
