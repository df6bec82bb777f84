"""The ``gcp:`` block of a providers-config entry, validated when the file is read.

``zone``, ``machineType`` and ``image`` are defaults for a Proxy's ``spec.placement``: a Proxy
that names them wins, one that does not gets these. Every check names the field and the fix, so a
typo stops start-up instead of failing every create much later.
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlparse

import msgspec

from services.providers.pure.targets import AllowedTarget, targets_problem

# Project ids: 6-30 characters; a domain-scoped project ("example.com:name") keeps its prefix.
PROJECT = re.compile(r"^([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]\Z")
# Zones, machine types, network tags and instance names share GCE's RFC 1035 rule.
RFC1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_RESOURCE_PATH = re.compile(r"^[A-Za-z0-9._/:-]+\Z")
DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
DEFAULT_MACHINE_TYPE = "e2-small"


class GcpConfig(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """Settings of one named gcp provider; see docs/providers.md for each field."""

    project: str = ""
    network: str = "default"
    subnetwork: str = ""
    network_tag: str = "egress-proxy"
    disk_size_gb: Annotated[int, msgspec.Meta(ge=10, le=65536)] = 10
    service_account: str = ""
    zone: str = ""
    machine_type: str = DEFAULT_MACHINE_TYPE
    image: str = DEFAULT_IMAGE
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=600)] = 30.0
    api_endpoint: str = ""
    allowed_targets: tuple[AllowedTarget, ...] = ()
    """Non-public ranges and ports the VMs' Squid may reach (D134)."""

    def __post_init__(self) -> None:
        problem = validate(self)
        if problem:
            raise ValueError(problem)


def validate(config: GcpConfig) -> str:
    """The first problem with ``config``, or ``""``; a message names the field and the fix."""
    if not config.project:
        return "project is required: the id of the GCP project the VMs run in, e.g. my-project"
    if not PROJECT.match(config.project):
        return (
            f"project {config.project!r} is not a GCP project id; use the id (6-30 lowercase "
            "letters, digits and '-'), not the display name or number"
        )
    for field, value in (("network", config.network), ("subnetwork", config.subnetwork)):
        if value and not _RESOURCE_PATH.match(value):
            return f"{field} {value!r}: use a name (default) or a path (global/networks/default)"
    if not config.network:
        return "network is required: a VPC name such as default"
    if config.network_tag and not RFC1035.match(config.network_tag):
        return (
            f"networkTag {config.network_tag!r}: use 1-63 lowercase letters, digits and '-', "
            "starting with a letter (the tag your firewall rule for port 3128 targets)"
        )
    if config.zone and not RFC1035.match(config.zone):
        return f"zone {config.zone!r}: use a zone name such as europe-west1-b"
    if not config.machine_type or not _RESOURCE_PATH.match(config.machine_type):
        return f"machineType {config.machine_type!r}: use a machine type such as e2-small"
    if not config.image or not _RESOURCE_PATH.match(config.image):
        return f"image {config.image!r}: use an image path such as {DEFAULT_IMAGE}"
    if config.service_account and "@" not in config.service_account:
        return (
            f"serviceAccount {config.service_account!r}: use the account's email, "
            "e.g. proxy-vm@my-project.iam.gserviceaccount.com, or leave it out"
        )
    if config.api_endpoint:
        url = urlparse(config.api_endpoint)
        if url.scheme not in ("http", "https") or not url.netloc or url.path not in ("", "/"):
            return (
                f"apiEndpoint {config.api_endpoint!r}: use a base URL such as "
                "https://compute.example.internal (no path), or leave it out for Google's"
            )
    return targets_problem(config.allowed_targets)
