"""The catalogue half of the Compute fake: machine types per zone, images, region quotas, VPC
firewall rules, the project, Resource Manager's permission check, and what an image runs.

It answers the shapes of Compute's public REST reference (``compute#machineType``,
``compute#machineTypeAggregatedList`` with its ``NO_RESULTS_ON_PAGE`` warnings, ``compute#image``,
``compute#region`` with ``quotas``, ``compute#firewallList``) and refuses an insert the way GCE
does: a machine type the zone lacks, an unknown zone, an image path that is malformed or names no
image (400 ``invalid``), a VM over the region's quota (403 ``quotaExceeded``). Each image knows
how it boots: the Debian and Rocky images run the guest agent's ``startup-script`` only, the
Ubuntu one cloud-init's ``user-data`` and the startup-script too; ``ran`` is what an instance's
image executed of its metadata, so a test fails when the key is wrong.

Only for tests; ``gcp.ComputeFake`` serves it.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MACHINE_TYPES = {
    "e2-micro": 2,
    "e2-small": 2,
    "e2-medium": 2,
    "n2-standard-2": 2,
    "c3-standard-4": 4,
}
"""Name -> guestCpus."""
_EVERYWHERE = frozenset(MACHINE_TYPES) - {"c3-standard-4"}
ZONES: dict[str, frozenset[str]] = {
    "europe-west1-b": _EVERYWHERE,
    "europe-west1-c": _EVERYWHERE,
    "europe-west1-d": frozenset(MACHINE_TYPES),
    "europe-west4-a": frozenset(MACHINE_TYPES),
    "us-east1-b": _EVERYWHERE,
    "us-east1-c": _EVERYWHERE,
    "us-central1-a": frozenset(MACHINE_TYPES),
}
"""Zone -> the machine types it offers: c3 is not in every zone, as on GCE."""
QUOTA_LIMITS = {"CPUS": 24.0, "E2_CPUS": 24.0, "INSTANCES": 24.0, "IN_USE_ADDRESSES": 8.0}
_HOST = "https://www.googleapis.com/compute/v1/"
_IMAGE_PATH = re.compile(
    r"^(?:https://[^/]+/compute/v1/)?projects/([a-z0-9.:-]+)/global/images/(family/)?([a-z0-9-]+)\Z"
)
_NAME_FILTER = re.compile(r'^\s*name\s*(?:=|eq)\s*"?([a-z0-9-]+)"?\s*\Z')


@dataclass(frozen=True)
class FakeImage:
    project: str
    name: str
    family: str
    cloud_init: bool
    """Whether it runs cloud-init (``user-data``); every image runs the guest agent's
    ``startup-script`` but the ones built without it (none here)."""
    guest_agent: bool = True


IMAGES = (
    FakeImage("debian-cloud", "debian-12-bookworm-v20251209", "debian-12", cloud_init=False),
    FakeImage("rocky-linux-cloud", "rocky-linux-9-v20251209", "rocky-linux-9", cloud_init=False),
    FakeImage(
        "ubuntu-os-cloud", "ubuntu-2404-noble-amd64-v20251209", "ubuntu-2404-lts-amd64", True
    ),
)
DEFAULT_FIREWALLS: tuple[tuple[str, list[tuple[str, list[str]]], list[str]], ...] = (
    ("default-allow-internal", [("tcp", ["0-65535"]), ("udp", ["0-65535"])], ["10.128.0.0/9"]),
    ("default-allow-ssh", [("tcp", ["22"])], ["0.0.0.0/0"]),
    ("default-allow-icmp", [("icmp", [])], ["0.0.0.0/0"]),
)
"""The rules a new project's default network has: none opens 3128."""


@dataclass
class CatalogueState:
    """What the catalogue answers; tests change it through ``ComputeFake``'s methods."""

    project: str
    zones: dict[str, set[str]] = field(
        default_factory=lambda: {zone: set(types) for zone, types in ZONES.items()}
    )
    images: list[FakeImage] = field(default_factory=lambda: list(IMAGES))
    quota_limits: dict[tuple[str, str], float] = field(default_factory=dict)
    quota_usage: dict[tuple[str, str], float] = field(default_factory=dict)
    """Usage by others (region, metric), added to the fake's own running instances."""
    firewalls: list[dict[str, Any]] = field(default_factory=list)
    granted: set[str] | None = None
    """The permissions the caller holds on the project; None: every one asked about."""

    def __post_init__(self) -> None:
        for name, allowed, sources in DEFAULT_FIREWALLS:
            self.add_firewall(name, allowed, sources)

    def add_firewall(
        self,
        name: str,
        allowed: list[tuple[str, list[str]]],
        sources: list[str],
        *,
        network: str = "default",
        target_tags: list[str] | None = None,
        direction: str = "INGRESS",
        disabled: bool = False,
    ) -> None:
        rule: dict[str, Any] = {
            "kind": "compute#firewall",
            "id": str(7_000_000 + len(self.firewalls)),
            "name": name,
            "network": f"{_HOST}projects/{self.project}/global/networks/{network}",
            "priority": 1000,
            "direction": direction,
            "disabled": disabled,
            "sourceRanges": sources,
            "allowed": [
                {"IPProtocol": protocol, **({"ports": ports} if ports else {})}
                for protocol, ports in allowed
            ],
            "selfLink": f"{_HOST}projects/{self.project}/global/firewalls/{name}",
        }
        if target_tags:
            rule["targetTags"] = target_tags
        self.firewalls.append(rule)

    # ---------------------------------------------------------------- lookups

    def image(self, path: str) -> FakeImage | str | None:
        """The image a path names; None for a well-formed path naming none; ``"malformed"``."""
        match = _IMAGE_PATH.match(path)
        if not match:
            return "malformed"
        project, family, name = match.groups()
        for image in self.images:
            if image.project == project and (image.family if family else image.name) == name:
                return image
        return None

    def image_body(self, image: FakeImage) -> dict[str, Any]:
        link = f"{_HOST}projects/{image.project}/global/images/{image.name}"
        return {
            "kind": "compute#image",
            "id": str(zlib.crc32(image.name.encode())),
            "creationTimestamp": "2025-12-09T03:04:05.000-08:00",
            "name": image.name,
            "family": image.family,
            "selfLink": link,
            "sourceType": "RAW",
            "status": "READY",
            "diskSizeGb": "10",
            "architecture": "X86_64",
            "licenses": [f"{_HOST}projects/{image.project}/global/licenses/{image.family}"],
        }

    def machine_type_body(self, zone: str, name: str) -> dict[str, Any]:
        cpus = MACHINE_TYPES[name]
        return {
            "kind": "compute#machineType",
            "id": str(900_000 + sorted(MACHINE_TYPES).index(name)),
            "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
            "name": name,
            "description": f"{cpus} vCPUs",
            "guestCpus": cpus,
            "memoryMb": 1024 * cpus,
            "maximumPersistentDisks": 128,
            "maximumPersistentDisksSizeGb": "263168",
            "zone": zone,
            "selfLink": f"{_HOST}projects/{self.project}/zones/{zone}/machineTypes/{name}",
            "isSharedCpu": name in ("e2-micro", "e2-small", "e2-medium"),
        }

    def aggregated_machine_types(self, query: dict[str, str]) -> dict[str, Any] | str:
        """The aggregated list, or the 400 message for a filter GCE would refuse."""
        wanted: str | None = None
        if query.get("filter"):
            match = _NAME_FILTER.match(query["filter"])
            if not match:
                return f"Invalid value for field 'filter': {query['filter']!r}"
            wanted = match.group(1)
        items: dict[str, Any] = {}
        for zone, offered in sorted(self.zones.items()):
            found = [
                self.machine_type_body(zone, name)
                for name in sorted(offered)
                if wanted is None or name == wanted
            ]
            scope = f"zones/{zone}"
            if found:
                items[scope] = {"machineTypes": found}
            else:
                items[scope] = {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": f"There are no results for scope '{scope}' on this page.",
                        "data": [{"key": "scope", "value": scope}],
                    }
                }
        return {
            "kind": "compute#machineTypeAggregatedList",
            "id": f"projects/{self.project}/aggregated/machineTypes",
            "items": items,
            "selfLink": f"{_HOST}projects/{self.project}/aggregated/machineTypes",
        }

    def region_body(self, region: str, usage: dict[str, float]) -> dict[str, Any]:
        zones = sorted(z for z in self.zones if z.rsplit("-", 1)[0] == region)
        quotas = [
            {
                "metric": metric,
                "limit": self.quota_limits.get((region, metric), limit),
                "usage": self.quota_usage.get((region, metric), 0.0) + usage.get(metric, 0.0),
            }
            for metric, limit in QUOTA_LIMITS.items()
        ]
        return {
            "kind": "compute#region",
            "id": str(1000 + len(region)),
            "name": region,
            "status": "UP",
            "zones": [f"{_HOST}projects/{self.project}/zones/{zone}" for zone in zones],
            "quotas": quotas,
            "selfLink": f"{_HOST}projects/{self.project}/regions/{region}",
        }

    def over_quota(self, region: str, usage: dict[str, float], needs: dict[str, float]) -> str:
        """GCE's message for an insert over a regional quota, or ``""``."""
        for quota in self.region_body(region, usage)["quotas"]:
            need = needs.get(quota["metric"], 0.0)
            if need and quota["usage"] + need > quota["limit"]:
                return (
                    f"Quota '{quota['metric']}' exceeded.  Limit: {quota['limit']:.1f} "
                    f"in region {region}."
                )
        return ""

    def unoffered(self, zone: str, body: dict[str, Any]) -> str:
        """What GCE refuses of an insert's zone, machine type and image, or ``""``."""
        if zone not in self.zones:
            return f"Invalid value for field 'zone': '{zone}'. Unknown zone."
        machine_type = str(body["machineType"])
        name = machine_type.rsplit("/", 1)[-1]
        if name not in self.zones[zone] or f"zones/{zone}/" not in machine_type:
            return (
                f"Invalid value for field 'resource.machineType': '{machine_type}'. "
                f"Machine type with name '{name}' does not exist in zone '{zone}'."
            )
        source = str(body["disks"][0].get("initializeParams", {}).get("sourceImage", ""))
        image = self.image(source)
        field_name = "resource.disks[0].initializeParams.sourceImage"
        if image == "malformed":
            return f"Invalid value for field '{field_name}': '{source}'. The URL is malformed."
        if image is None:
            return (
                f"Invalid value for field '{field_name}': '{source}'. "
                "The referenced image resource cannot be found."
            )
        return ""

    def answer(
        self,
        kind: str,
        args: tuple[str, ...],
        params: dict[str, str],
        body: dict[str, Any],
        usage: dict[str, float],
    ) -> tuple[int, dict[str, Any]]:
        """A catalogue call's answer (``usage``: the fake's own VMs' in a region asked)."""
        catalogue = self
        if kind == "projects":
            return 200, catalogue.project_body()
        if kind == "iam":
            return 200, catalogue.test_permissions(body)
        if kind == "machineTypes" and args:
            zone, name = args
            if name not in catalogue.zones.get(zone, set()):
                link = f"projects/{self.project}/zones/{zone}/machineTypes/{name}"
                return error(404, "notFound", f"The resource '{link}' was not found")
            return 200, catalogue.machine_type_body(zone, name)
        if kind == "machineTypes":
            answer = catalogue.aggregated_machine_types(params)
            if isinstance(answer, str):
                return error(400, "invalid", answer)
            return 200, answer
        if kind == "regions":
            (region,) = args
            if not any(zone.rsplit("-", 1)[0] == region for zone in catalogue.zones):
                link = f"projects/{self.project}/regions/{region}"
                return error(404, "notFound", f"The resource '{link}' was not found")
            return 200, catalogue.region_body(region, usage)
        return 200, {
            "kind": "compute#firewallList",
            "id": f"projects/{self.project}/global/firewalls",
            "items": list(catalogue.firewalls),
            "selfLink": f"{_HOST}projects/{self.project}/global/firewalls",
        }

    def project_body(self) -> dict[str, Any]:
        return {
            "kind": "compute#project",
            "id": "31415926535",
            "name": self.project,
            "defaultNetworkTier": "PREMIUM",
            "selfLink": f"{_HOST}projects/{self.project}",
        }

    def test_permissions(self, body: dict[str, Any]) -> dict[str, Any]:
        asked = [str(p) for p in body.get("permissions", []) if isinstance(p, str)]
        held = [p for p in asked if self.granted is None or p in self.granted]
        # An empty answer omits the field, as proto3 JSON does.
        return {"permissions": held} if held else {}


def ran(image: FakeImage, metadata: dict[str, str]) -> dict[str, str]:
    """The metadata an image executes at first boot: cloud-init's ``user-data``, the guest
    agent's ``startup-script``; any other key, or a key the image lacks the agent for, is
    never run."""
    executed: dict[str, str] = {}
    if image.cloud_init and "user-data" in metadata:
        executed["user-data"] = metadata["user-data"]
    if image.guest_agent and "startup-script" in metadata:
        executed["startup-script"] = metadata["startup-script"]
    return executed


def cpu_metric(machine_type: str) -> str:
    return "E2_CPUS" if machine_type.startswith("e2-") else "CPUS"


def usage(vms: Iterable[tuple[str, str]]) -> dict[str, float]:
    """The regional quota metrics ``vms`` ((zone, machine type) pairs) use."""
    used: dict[str, float] = {}
    for _, machine_type in vms:
        name = machine_type.rsplit("/", 1)[-1]
        cpus = float(MACHINE_TYPES.get(name, 0))
        for metric, amount in (
            (cpu_metric(name), cpus),
            ("INSTANCES", 1.0),
            ("IN_USE_ADDRESSES", 1.0),
        ):
            used[metric] = used.get(metric, 0.0) + amount
    return used


_REASON_DOMAINS = {"quotaExceeded": "usageLimits", "rateLimitExceeded": "usageLimits"}


def error(status: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    """GCE's JSON error shape, which the client turns into a GoogleAPICallError."""
    return status, {
        "error": {
            "code": status,
            "message": message,
            "errors": [
                {
                    "message": message,
                    "domain": _REASON_DOMAINS.get(reason, "global"),
                    "reason": reason,
                }
            ],
        }
    }
