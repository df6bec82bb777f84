"""A local HTTP fake of the Compute Engine REST endpoints the gcp provider calls.

The provider is tested through the real ``google-cloud-compute`` client (REST transport,
anonymous credentials, ``apiEndpoint`` pointing here), so request encoding, error decoding and
paging are the library's own, not a mock's. The fake answers what GCE answers for the calls we
make: instances insert/get/delete, aggregatedList (label filters, paging), zone operations get,
with GCE's JSON error shape. Instances move PROVISIONING -> STAGING -> RUNNING, one step per
``get``, and get a distinct ephemeral ``natIP`` when they run; a deleted instance is STOPPING for
one more ``get``, then gone.

The catalogue calls (machine types, images, regions, firewalls, the project, Resource Manager's
permission check) and the insert's refusals of what the catalogue lacks are
``gcp_catalogue``'s; ``ran`` says what an instance's image executed of its metadata.

Errors are injected per call kind (``insert``, ``get``, ``delete``, ``aggregatedList``,
``operations``, and the catalogue's ``machineTypes``, ``images``, ``regions``, ``firewalls``,
``projects``, ``iam``) or for the next call of any kind, with the HTTP status and GCE reason;
``operation_error`` makes the next insert accepted-but-failed, as GCE reports capacity stock-outs.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from services.testing import cloud_http, gcp_catalogue
from services.testing.cloud_http import Fault, Reply, Request
from services.testing.gcp_catalogue import CatalogueState, FakeImage
from services.testing.gcp_catalogue import error as _error

KINDS = (
    "insert",
    "get",
    "delete",
    "aggregatedList",
    "operations",
    "machineTypes",
    "images",
    "regions",
    "firewalls",
    "projects",
    "iam",
    "any",
)
_BASE = "/compute/v1/projects/"
_IAM = re.compile(r"^/v1/projects/([^/:]+):testIamPermissions\Z")
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}\Z")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}\Z")
_FILTER_TERM = re.compile(r'\(\s*labels\.([a-z0-9_-]+)\s*=\s*"?([^")]*?)"?\s*\)')
# GCE reports times in the project's local offset; UTC conversion is the provider's job.
_GCE_TZ = timezone(timedelta(hours=-7))
_OPERATION_STATUS = {
    "QUOTA_EXCEEDED": 403,
    "RESOURCE_OPERATION_RATE_EXCEEDED": 403,
    "ZONE_RESOURCE_POOL_EXHAUSTED": 503,
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": 503,
}


@dataclass
class _Instance:
    body: dict[str, Any]
    zone: str
    steps: deque[str] = field(default_factory=lambda: deque(["STAGING", "RUNNING"]))
    deleting: bool = False


class ComputeFake(cloud_http.FakeServer):
    """The fake server; use as a context manager (``with ComputeFake() as fake``)."""

    thread_name = "compute-fake"

    def __init__(self, project: str = "test-project") -> None:
        super().__init__(KINDS)
        self.project = project
        self.requests: list[tuple[str, str]] = []
        self.instances: dict[tuple[str, str], _Instance] = {}
        self.inserted_total = 0
        self._operation_errors: deque[tuple[str, str, int]] = deque()
        self._ids = itertools.count(4_000_000_000_000_000_001, 7919)
        self._ips = itertools.count(1)
        self._ops = itertools.count(1)
        self.catalogue = CatalogueState(project)
        self.boots: dict[tuple[str, str], dict[str, str]] = {}

    # ---------------------------------------------------------------- catalogue control

    def offer(self, zone: str, *machine_types: str) -> None:
        """Make ``zone`` offer exactly ``machine_types`` (of ``gcp_catalogue.MACHINE_TYPES``)."""
        with self._lock:
            self.catalogue.zones[zone] = set(machine_types)

    def quota(
        self, region: str, metric: str, *, limit: float | None = None, usage: float | None = None
    ) -> None:
        """Set a regional quota's limit, or the usage others add to this fake's own VMs."""
        with self._lock:
            if limit is not None:
                self.catalogue.quota_limits[(region, metric)] = limit
            if usage is not None:
                self.catalogue.quota_usage[(region, metric)] = usage

    def add_firewall(
        self, name: str, allowed: list[tuple[str, list[str]]], sources: list[str], **kw: Any
    ) -> None:
        """A VPC firewall rule (``network``, ``target_tags``, ``direction``, ``disabled``)."""
        with self._lock:
            self.catalogue.add_firewall(name, allowed, sources, **kw)

    def grant(self, permissions: set[str] | None) -> None:
        """The permissions the caller holds on the project; None: every one."""
        with self._lock:
            self.catalogue.granted = permissions

    def add_image(self, image: FakeImage) -> None:
        with self._lock:
            self.catalogue.images.append(image)

    def ran(self, zone: str, name: str) -> dict[str, str]:
        """The metadata the instance's image executed at first boot, by key."""
        with self._lock:
            return dict(self.boots.get((zone, name), {}))

    # ---------------------------------------------------------------- control

    def inject(
        self, status: int, reason: str, *, kind: str = "any", times: int = 1, message: str = ""
    ) -> None:
        """Answer the next ``times`` calls of ``kind`` with a GCE error."""
        self.add_fault(
            kind, Fault(status, reason, message or f"injected {reason} ({status})", times)
        )

    def operation_error(self, code: str, message: str = "", *, status: int = 0) -> None:
        """Accept the next insert but report it DONE with this error and create nothing;
        ``status`` is the operation's httpErrorStatusCode (by default the one GCE uses)."""
        status = status or _OPERATION_STATUS.get(code, 400)
        with self._lock:
            self._operation_errors.append((code, message or f"injected {code}", status))

    def put(self, zone: str, name: str, labels: dict[str, str], status: str = "RUNNING") -> None:
        """An instance made by someone else (the console, another tool), for listing tests."""
        body = {"name": name, "labels": labels, "status": status, "zone": self._zone_link(zone)}
        body["creationTimestamp"] = datetime.now(_GCE_TZ).isoformat(timespec="milliseconds")
        with self._lock:
            self.instances[(zone, name)] = _Instance(body, zone, deque())

    def vanish(self, zone: str, name: str) -> None:
        """Delete behind the provider's back (a preemption, a person in the console)."""
        with self._lock:
            del self.instances[(zone, name)]

    def set_status(self, zone: str, name: str, status: str) -> None:
        with self._lock:
            record = self.instances[(zone, name)]
            record.body["status"] = status
            record.steps.clear()

    # ---------------------------------------------------------------- dispatch

    def serve(self, request: Request) -> Reply:
        status, answer = self._answer(request)
        return cloud_http.json_reply(status, answer, content_type="application/json; charset=UTF-8")

    def _answer(self, request: Request) -> tuple[int, dict[str, Any]]:
        method, path = request.method, request.path
        with self._lock:
            self.requests.append((method, path))
        route = self._route(method, path)
        if route is None:
            return _error(404, "notFound", f"no fake route for {method} {path}")
        kind, project, args = route
        fault = self.fault_for(kind)
        if fault is not None:
            return _error(fault.status, fault.code, fault.message)
        with self._lock:
            if kind == "images":
                return self._image(project, *args)
            if project != self.project:
                return _error(404, "notFound", f"The resource 'projects/{project}' was not found")
            if kind == "insert":
                return self._insert(args[0], cloud_http.parse_json(request.body))
            if kind == "get":
                return self._get(*args)
            if kind == "delete":
                return self._delete(*args)
            if kind == "aggregatedList":
                return self._aggregated(request.params)
            if kind in ("machineTypes", "regions", "firewalls", "projects", "iam"):
                usage = self._usage(args[0]) if kind == "regions" else {}
                body = cloud_http.parse_json(request.body)
                return self.catalogue.answer(kind, args, request.params, body, usage)
            return 200, self._operation(args[0], "insert", "", done=True, name=args[1])

    def _route(self, method: str, path: str) -> tuple[str, str, tuple[str, ...]] | None:
        iam = _IAM.match(path)
        if method == "POST" and iam:
            return "iam", iam.group(1), ()
        if not path.startswith(_BASE):
            return None
        parts = path[len(_BASE) :].split("/")
        match (method, parts):
            case ("GET", [project]):
                return "projects", project, ()
            case ("GET", [project, "zones", zone, "machineTypes", name]):
                return "machineTypes", project, (zone, name)
            case ("GET", [project, "aggregated", "machineTypes"]):
                return "machineTypes", project, ()
            case ("GET", [project, "global", "images", "family", family]):
                return "images", project, ("family/", family)
            case ("GET", [project, "global", "images", name]):
                return "images", project, ("", name)
            case ("GET", [project, "regions", region]):
                return "regions", project, (region,)
            case ("GET", [project, "global", "firewalls"]):
                return "firewalls", project, ()
            case ("POST", [project, "zones", zone, "instances"]):
                return "insert", project, (zone,)
            case ("GET", [project, "zones", zone, "instances", name]):
                return "get", project, (zone, name)
            case ("DELETE", [project, "zones", zone, "instances", name]):
                return "delete", project, (zone, name)
            case ("GET", [project, "aggregated", "instances"]):
                return "aggregatedList", project, ()
            case ("GET", [project, "zones", zone, "operations", name]):
                return "operations", project, (zone, name)
        return None

    # ---------------------------------------------------------------- calls

    def _insert(self, zone: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = str(body.get("name", ""))
        problem = _invalid(body) or self.catalogue.unoffered(zone, body)
        if problem:
            return _error(400, "invalid", problem)
        machine_type = str(body["machineType"]).rsplit("/", 1)[-1]
        region = zone.rsplit("-", 1)[0]
        over = self.catalogue.over_quota(
            region, self._usage(region), gcp_catalogue.usage([(zone, machine_type)])
        )
        if over and (zone, name) not in self.instances:
            return _error(403, "quotaExceeded", over)
        if (zone, name) in self.instances:
            return _error(
                409, "alreadyExists", f"The resource '{self._link(zone, name)}' already exists"
            )
        if self._operation_errors:
            code, message, status = self._operation_errors.popleft()
            operation = self._operation(zone, "insert", name, done=True)
            operation["error"] = {"errors": [{"code": code, "message": message}]}
            operation["httpErrorStatusCode"] = status
            return 200, operation
        now = datetime.now(_GCE_TZ).isoformat(timespec="milliseconds")
        stored = dict(body)
        stored.update(
            kind="compute#instance",
            id=str(next(self._ids)),
            status="PROVISIONING",
            zone=self._zone_link(zone),
            selfLink=self._link(zone, name),
            creationTimestamp=now,
        )
        self.instances[(zone, name)] = _Instance(stored, zone)
        self.inserted_total += 1
        image = self.catalogue.image(str(body["disks"][0]["initializeParams"]["sourceImage"]))
        assert isinstance(image, FakeImage)  # _unoffered refused any other
        metadata = {
            str(item.get("key")): str(item.get("value", ""))
            for item in body.get("metadata", {}).get("items", [])
        }
        self.boots[(zone, name)] = gcp_catalogue.ran(image, metadata)
        return 200, self._operation(zone, "insert", name, done=False)

    def _get(self, zone: str, name: str) -> tuple[int, dict[str, Any]]:
        record = self.instances.get((zone, name))
        if record is None:
            return self._not_found(zone, name)
        answer = json.loads(json.dumps(record.body))
        if record.deleting:
            del self.instances[(zone, name)]  # STOPPING once more, then gone
        elif record.steps:
            record.body["status"] = record.steps.popleft()
            if record.body["status"] == "RUNNING":
                number = next(self._ips)
                nat_ip = f"10.{number // 65536 % 256}.{number // 256 % 256}.{number % 256}"
                for interface in record.body.get("networkInterfaces", []):
                    for access in interface.get("accessConfigs", []):
                        access["natIP"] = nat_ip
        return 200, answer

    def _delete(self, zone: str, name: str) -> tuple[int, dict[str, Any]]:
        record = self.instances.get((zone, name))
        if record is None:
            return self._not_found(zone, name)
        record.deleting = True
        record.steps.clear()
        record.body["status"] = "STOPPING"
        return 200, self._operation(zone, "delete", name, done=False)

    def _aggregated(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        wanted = dict(_FILTER_TERM.findall(query.get("filter", "")))
        if query.get("filter") and not wanted:
            return _error(400, "invalid", f"Invalid value for field 'filter': {query['filter']!r}")
        matching = [
            record
            for _, record in sorted(self.instances.items())
            if all(record.body.get("labels", {}).get(k) == v for k, v in wanted.items())
        ]
        start = int(query.get("pageToken") or 0)
        size = int(query.get("maxResults") or 500)
        page = matching[start : start + size]
        items: dict[str, dict[str, Any]] = {}
        for record in page:
            scope = items.setdefault(f"zones/{record.zone}", {"instances": []})
            scope["instances"].append(record.body)
        answer: dict[str, Any] = {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{self.project}/aggregated/instances",
            "items": items,
        }
        if start + size < len(matching):
            answer["nextPageToken"] = str(start + size)
        return 200, answer

    def _usage(self, region: str) -> dict[str, float]:
        """What this fake's own VMs in ``region`` use of its quotas."""
        return gcp_catalogue.usage(
            (record.zone, str(record.body.get("machineType", "")))
            for record in self.instances.values()
            if record.zone.rsplit("-", 1)[0] == region
        )

    def _image(self, project: str, prefix: str, name: str) -> tuple[int, dict[str, Any]]:
        path = f"projects/{project}/global/images/{prefix}{name}"
        image = self.catalogue.image(path)
        if not isinstance(image, FakeImage):
            return _error(404, "notFound", f"The resource '{path}' was not found")
        return 200, self.catalogue.image_body(image)

    # ---------------------------------------------------------------- shapes

    def _zone_link(self, zone: str) -> str:
        return f"https://www.googleapis.com/compute/v1/projects/{self.project}/zones/{zone}"

    def _link(self, zone: str, name: str) -> str:
        return f"projects/{self.project}/zones/{zone}/instances/{name}"

    def _not_found(self, zone: str, name: str) -> tuple[int, dict[str, Any]]:
        return _error(404, "notFound", f"The resource '{self._link(zone, name)}' was not found")

    def _operation(
        self, zone: str, kind: str, target: str, *, done: bool, name: str = ""
    ) -> dict[str, Any]:
        return {
            "kind": "compute#operation",
            "id": str(next(self._ids)),
            "name": name or f"operation-{next(self._ops)}",
            "zone": self._zone_link(zone),
            "operationType": kind,
            "targetLink": self._link(zone, target) if target else "",
            "status": "DONE" if done else "RUNNING",
            "progress": 100 if done else 0,
            "insertTime": datetime.now(UTC).isoformat(),
        }


def _invalid(body: dict[str, Any]) -> str:
    """What GCE would refuse in an insert body, for the fields the provider sends."""
    name = str(body.get("name", ""))
    if not _NAME.match(name):
        return f"Invalid value for field 'resource.name': {name!r}. Must be a match of regex"
    if not body.get("machineType"):
        return "Invalid value for field 'resource.machineType': ''"
    if not body.get("disks") or not body.get("networkInterfaces"):
        return "Invalid value for field 'resource': disks and networkInterfaces are required"
    for key, value in body.get("labels", {}).items():
        if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(str(value)):
            return f"Invalid value for field 'resource.labels': {key}={value!r}"
    return ""
