"""What the preflight and the catalogue check conclude from GCE's answers (pure, no I/O).

The calls are made elsewhere (``gcp/catalogue.py``, ``gcp/preflight.py``); these functions turn
their answers into verdicts with their reasons, so each rule is tested row by row without a
server (docs/decisions/0140-gcp-images-as-they-boot.md).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

SHOWN_ZONES = 12
"""How many zones a "where it is offered" list names before "and N more"."""
_MACHINE_TYPE_PATH = re.compile(r"(?:^|/)zones/([a-z][-a-z0-9]*)/machineTypes/([a-z0-9-]+)\Z")
_NETWORK_PATH = re.compile(r"(?:^|/)(projects/[a-z0-9.:-]+/global/networks/[a-z0-9-]+)\Z")


def machine_type_in(zone: str, machine_type: str) -> tuple[str, str]:
    """``(zone, name)`` of the machine type an insert names: a path names its own zone."""
    match = _MACHINE_TYPE_PATH.search(machine_type)
    if match:
        return match.group(1), match.group(2)
    return zone, machine_type.rsplit("/", 1)[-1]


def is_custom(machine_type: str) -> bool:
    """Custom machine types (``custom-2-4096``, ``e2-custom-2-4096``) are made to order, not
    listed in a zone's catalogue: they are left to the insert to judge."""
    return "custom-" in machine_type


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def where_offered(zone: str, zones: Iterable[str], shown: int = SHOWN_ZONES) -> str:
    """The zones offering a machine type, those of ``zone``'s region first."""
    region = region_of(zone)
    ordered = sorted(set(zones), key=lambda z: (region_of(z) != region, z))
    if not ordered:
        return "it is offered in no zone this project can use"
    named = ", ".join(ordered[:shown])
    more = f" and {len(ordered) - shown} more" if len(ordered) > shown else ""
    return f"it is offered in {named}{more}"


def not_offered(machine_type: str, zone: str, zones: Iterable[str]) -> str:
    """The refusal of a machine type in a zone, naming both fields and where it would work."""
    return (
        f"machineType {machine_type!r} is not offered in zone {zone!r} "
        f"(spec.placement.machineType or gcp.machineType, spec.placement.zone or gcp.zone); "
        f"{where_offered(zone, zones)}"
    )


def cpu_metric(machine_type: str, metrics: Collection[str]) -> str:
    """The regional quota a machine type's vCPUs count against: its series' own (``E2_CPUS``,
    ``N2_CPUS``) where the region reports one, else ``CPUS``."""
    series = machine_type.split("-", 1)[0].upper()
    own = f"{series}_CPUS"
    return own if own in metrics else "CPUS"


@dataclass(frozen=True, slots=True)
class Headroom:
    metric: str
    ok: bool
    detail: str


def headroom(
    quotas: Mapping[str, tuple[float, float]], needs: Mapping[str, float]
) -> list[Headroom]:
    """For each metric one VM needs (``needs``: metric -> amount), whether the region's
    ``quotas`` (metric -> (limit, usage)) leave room for it; a metric the region does not
    report is not judged."""
    found: list[Headroom] = []
    for metric, need in needs.items():
        if metric not in quotas:
            found.append(Headroom(metric, True, f"{metric}: not reported by the region"))
            continue
        limit, usage = quotas[metric]
        free = limit - usage
        detail = f"{metric}: {usage:g} of {limit:g} used, {free:g} free, one VM needs {need:g}"
        found.append(Headroom(metric, free >= need, detail))
    return found


@dataclass(frozen=True, slots=True)
class Rule:
    """A VPC firewall rule, as far as "does it let clients reach the proxy port" goes."""

    name: str
    network: str
    direction: str
    disabled: bool
    allowed: Sequence[tuple[str, Sequence[str]]]
    """(protocol, ports) pairs; no ports means every port."""
    target_tags: Sequence[str] = ()
    target_service_accounts: Sequence[str] = ()
    source_ranges: Sequence[str] = ()


def same_network(rule_network: str, network: str, project: str) -> bool:
    """Whether a rule's network URL is the entry's ``network`` (a name in ``project``, or a
    path such as ``projects/host/global/networks/shared``)."""
    wanted = network if "/" in network else f"projects/{project}/global/networks/{network}"
    here = _NETWORK_PATH.search(rule_network)
    there = _NETWORK_PATH.search(wanted)
    return bool(here and there and here.group(1) == there.group(1))


_INTERNAL = tuple(
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "fc00::/7",
        "fe80::/10",
    )
)


def from_outside(source_range: str) -> bool:
    """Whether a source range holds addresses outside private space: clients reach a proxy at
    its external IP from their public addresses, so a rule for internal ranges only (the
    default network's ``default-allow-internal``) lets none of them in."""
    try:
        network = ipaddress.ip_network(source_range, strict=False)
    except ValueError:
        return False
    return not any(
        network.version == inner.version and network.subnet_of(inner)  # type: ignore[arg-type]  # same version checked
        for inner in _INTERNAL
    )


def opens(rule: Rule, *, tag: str, service_account: str, port: int) -> bool:
    """Whether ``rule`` lets tcp ``port`` in, from outside private space, to a VM with network
    tag ``tag`` (empty: none) and ``service_account`` (empty: none)."""
    if rule.disabled or rule.direction != "INGRESS":
        return False
    if not any(from_outside(source) for source in rule.source_ranges):
        return False
    targeted = (
        (not rule.target_tags and not rule.target_service_accounts)
        or (bool(tag) and tag in rule.target_tags)
        or (bool(service_account) and service_account in rule.target_service_accounts)
    )
    if not targeted:
        return False
    return any(
        protocol in ("tcp", "all") and _covers(ports, port) for protocol, ports in rule.allowed
    )


def _covers(ports: Sequence[str], port: int) -> bool:
    if not ports:
        return True
    for entry in ports:
        low, _, high = entry.partition("-")
        try:
            if int(low) <= port <= int(high or low):
                return True
        except ValueError:
            continue
    return False
