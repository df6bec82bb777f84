"""A gcp entry checked against GCE before it costs anything (services/providers/preflight.py).

Read-only, in this order: the credentials and the project (Compute's ``projects.get``: it fails
the same way every later call would, so nothing more is asked when it does), the permissions a
create needs (Resource Manager's ``projects.testIamPermissions``: Compute has no project-level
check), the image and the key it runs the script from, the machine type in the zone (the cached
catalogue a create asks too), the region's quota headroom for one more VM, and the VPC firewall
rule that lets clients reach port 3128 (the provider writes none: docs/providers.md, gcp,
Firewall). Each answer becomes a ``Finding``; see docs/decisions/0140-gcp-images-as-they-boot.md.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from google.cloud import compute_v1

from services.providers.base import DEFAULT_PROXY_PORT, ProviderError
from services.providers.gcp.client import granted_permissions, translate
from services.providers.gcp.pure import boot, checks
from services.providers.gcp.pure.mapping import short_name
from services.providers.preflight import Finding

if TYPE_CHECKING:
    from services.providers.gcp.provider import GcpProvider

T = TypeVar("T")
PERMISSIONS = (
    "compute.instances.create",
    "compute.instances.get",
    "compute.instances.list",
    "compute.instances.delete",
    "compute.instances.setMetadata",
    "compute.instances.setLabels",
    "compute.instances.setTags",
    "compute.disks.create",
    "compute.subnetworks.use",
    "compute.subnetworks.useExternalIp",
    "compute.machineTypes.get",
    "compute.machineTypes.list",
)
"""What the provider's calls need on the project (docs/providers.md, gcp, Credentials and IAM)."""
ROLE_FIX = (
    "grant roles/compute.instanceAdmin.v1 on the project to the identity the executor and gc "
    "run as (docs/providers.md, gcp, Credentials and IAM)"
)
_IMAGE = re.compile(
    r"^(?:https://[^/]+/compute/v1/)?(?:projects/([a-z0-9.:-]+)/)?global/images/"
    r"(family/)?([a-z0-9-]+)\Z"
)
_NETWORK_PROJECT = re.compile(r"(?:^|/)projects/([a-z0-9.:-]+)/global/networks/")


async def preflight(provider: GcpProvider) -> list[Finding]:
    return await asyncio.to_thread(_checks, provider)


def _checks(provider: GcpProvider) -> list[Finding]:
    config = provider.config
    credentials = _ask(
        lambda: provider.client(compute_v1.ProjectsClient).get(
            project=config.project, timeout=config.timeout_seconds, retry=None
        )
    )
    if isinstance(credentials, ProviderError):
        return [
            Finding(
                "credentials",
                False,
                f"Compute answered projects.get for {config.project!r} with: {credentials}",
                "check the project id (gcp.project), that the Compute Engine API is enabled in "
                "it, and the credentials (Application Default Credentials: docs/providers.md, "
                "gcp, Credentials and IAM)",
            )
        ]
    found = [Finding("credentials", True, f"project {config.project} answers with these")]
    found.append(_permissions(provider))
    found.append(_image(provider))
    cpus = _machine_type(provider, found)
    if config.zone:
        found.extend(_quota(provider, cpus))
    found.append(_firewall(provider))
    return found


def _ask(call: Callable[[], T]) -> T | ProviderError:
    """``call``'s answer, or the client's error as a taxonomy error (never raised here)."""
    try:
        return call()
    except Exception as exc:
        translated = translate(exc, op="get", what="")
        if translated is None:
            raise
        return translated


def _permissions(provider: GcpProvider) -> Finding:
    config = provider.config
    wanted = list(PERMISSIONS)
    if "/" in config.network:
        # A Shared VPC's subnetworks are granted on the host project, not checked here.
        wanted = [p for p in wanted if not p.startswith("compute.subnetworks.")]
    held = _ask(
        lambda: granted_permissions(
            provider.name, config, wanted, provider.full_payloads, provider.credentials
        )
    )
    if isinstance(held, ProviderError):
        return Finding(
            "permissions",
            True,
            f"not checked: Resource Manager's testIamPermissions answered {held}; the first "
            "create will tell (enable cloudresourcemanager.googleapis.com to check them here)",
        )
    missing = [p for p in wanted if p not in held]
    if missing:
        return Finding(
            "permissions", False, f"missing on {config.project}: {', '.join(missing)}", ROLE_FIX
        )
    return Finding("permissions", True, f"all {len(wanted)} a create and the gc need are held")


def _image(provider: GcpProvider) -> Finding:
    config = provider.config
    match = _IMAGE.match(config.image)
    if not match:
        return Finding(
            "image",
            False,
            f"{config.image!r} is not an image path GCE accepts",
            "set gcp.image to projects/PROJECT/global/images/family/FAMILY or .../images/NAME",
        )
    project, family, name = match.group(1) or config.project, match.group(2), match.group(3)
    images = provider.client(compute_v1.ImagesClient)
    timeout = config.timeout_seconds
    if family:
        answer = _ask(
            lambda: images.get_from_family(
                project=project, family=name, timeout=timeout, retry=None
            )
        )
    else:
        answer = _ask(lambda: images.get(project=project, image=name, timeout=timeout, retry=None))
    if isinstance(answer, ProviderError):
        return Finding(
            "image",
            False,
            f"{config.image}: {answer}",
            "set gcp.image to an image this project may use, e.g. "
            "projects/debian-cloud/global/images/family/debian-12",
        )
    how = boot.boot_of(config.image)
    keys = " and ".join(boot.keys_for(how))
    detail = (
        f"{config.image} is {answer.name}; it boots with {how.value}: the script goes in {keys}"
    )
    if how is boot.Boot.GUEST_AGENT:
        detail += "; a Proxy's cloudInit must be shell scripts (a #cloud-config is refused)"
    elif how is boot.Boot.UNKNOWN:
        detail += (
            " (not one of Google's public images: the startup-script stands aside where "
            "cloud-init is installed)"
        )
    return Finding("image", True, detail)


def _machine_type(provider: GcpProvider, found: list[Finding]) -> int:
    """The machine type's vCPUs in the zone (0 when not known), its findings appended."""
    config = provider.config
    zone, name = checks.machine_type_in(config.zone, config.machine_type)
    if checks.is_custom(name):
        found.append(Finding("machineType", True, f"{name} is custom: the insert judges it"))
        return 0
    if not zone:
        zones = _ask(lambda: provider.catalogue.zones_offering(name))
        if isinstance(zones, ProviderError):
            found.append(Finding("machineType", False, f"{name}: {zones}", ROLE_FIX))
            return 0
        found.append(
            Finding(
                "zone",
                True,
                "none set: every Proxy must name spec.placement.zone (a create without one "
                "is refused)",
            )
        )
        found.append(
            Finding(
                "machineType",
                bool(zones),
                f"{name}: {checks.where_offered('', zones)}",
                "" if zones else "set gcp.machineType to a machine type GCE offers, e.g. e2-small",
            )
        )
        return 0
    check = f"machineType in {zone}"
    cpus = _ask(lambda: provider.catalogue.guest_cpus(zone, name))
    if isinstance(cpus, ProviderError):
        found.append(Finding(check, False, f"{name}: {cpus}", ROLE_FIX))
        return 0
    if cpus is not None:
        found.append(Finding(check, True, f"{name} is offered ({cpus} vCPUs)"))
        return cpus
    zones = _ask(lambda: provider.catalogue.zones_offering(name))
    elsewhere = () if isinstance(zones, ProviderError) else zones
    found.append(
        Finding(
            check,
            False,
            checks.not_offered(name, zone, elsewhere),
            "set gcp.zone to a zone that offers it, or gcp.machineType to one this zone offers",
        )
    )
    return 0


def _quota(provider: GcpProvider, cpus: int) -> list[Finding]:
    config = provider.config
    region = checks.region_of(config.zone)
    answer = _ask(
        lambda: provider.client(compute_v1.RegionsClient).get(
            project=config.project, region=region, timeout=config.timeout_seconds, retry=None
        )
    )
    if isinstance(answer, ProviderError):
        return [Finding(f"quota in {region}", True, f"not checked: regions.get answered {answer}")]
    quotas = {q.metric: (float(q.limit), float(q.usage)) for q in answer.quotas}
    _, name = checks.machine_type_in(config.zone, config.machine_type)
    needs: dict[str, float] = {"INSTANCES": 1.0, "IN_USE_ADDRESSES": 1.0}
    if cpus:
        needs = {checks.cpu_metric(name, quotas): float(cpus), **needs}
    fix = (
        f"ask for a higher quota in {region} (console: IAM & Admin, Quotas), free some, or "
        "use another region"
    )
    return [
        Finding(f"quota {room.metric} in {region}", room.ok, room.detail, "" if room.ok else fix)
        for room in checks.headroom(quotas, needs)
    ]


def _firewall(provider: GcpProvider) -> Finding:
    config = provider.config
    network_project = _NETWORK_PROJECT.search(config.network)
    project = network_project.group(1) if network_project else config.project
    answer = _ask(
        lambda: list(
            provider.client(compute_v1.FirewallsClient).list(
                project=project, timeout=config.timeout_seconds, retry=None
            )
        )
    )
    port = DEFAULT_PROXY_PORT
    fix = (
        f"create an INGRESS rule allowing tcp:{port} from your crawlers' and the health "
        f"prober's ranges to tag {config.network_tag or '(all instances)'} on network "
        f"{short_name(config.network)} (docs/providers.md, gcp, Firewall)"
    )
    if isinstance(answer, ProviderError):
        return Finding("firewall", False, f"firewalls.list in {project}: {answer}", fix)
    opening = [
        rule
        for rule in map(_rule, answer)
        if checks.same_network(rule.network, config.network, config.project)
        and checks.opens(
            rule, tag=config.network_tag, service_account=config.service_account, port=port
        )
    ]
    if not opening:
        return Finding(
            "firewall", False, f"no rule of network {config.network} opens tcp:{port}", fix
        )
    shown = "; ".join(f"{r.name} from {', '.join(r.source_ranges) or 'nowhere'}" for r in opening)
    world = any(s in ("0.0.0.0/0", "::/0") for r in opening for s in r.source_ranges)
    note = " (open to the whole internet: the lease check is then the only gate)" if world else ""
    return Finding("firewall", True, f"tcp:{port} is opened by {shown}{note}")


def _rule(raw: compute_v1.Firewall) -> checks.Rule:
    return checks.Rule(
        name=raw.name,
        network=raw.network,
        direction=raw.direction,
        disabled=raw.disabled,
        allowed=[(a.I_p_protocol, list(a.ports)) for a in raw.allowed],
        target_tags=list(raw.target_tags),
        target_service_accounts=list(raw.target_service_accounts),
        source_ranges=list(raw.source_ranges),
    )
