"""Where an instance goes (zone and subnet) and what its security group allows: pure choices
over what EC2 described.

The subnet is chosen by a stable hash of the instance name (``cloud/pure/spread.py`` says why):
first the zone (the Proxy's ``spec.placement.zone``, else one of ``zones``), then one of the
usable subnets in that zone. Without ``zones``, every usable subnet is a choice, sorted by zone,
so a fleet spreads over the zones the VPC has.

The security group opens ``proxyPort`` over TCP to ``allowedClients`` and nothing else: what it
holds besides (a rule added by hand, an old port, a range since removed from the config) is
revoked, so the config is the whole truth of who reaches the proxies.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.providers.cloud.pure.spread import spread


@dataclass(frozen=True, slots=True, order=True)
class Subnet:
    zone: str
    subnet_id: str
    vpc_id: str = ""


def subnet_of(raw: Mapping[str, Any]) -> Subnet:
    """One ``Subnets[]`` entry of DescribeSubnets."""
    return Subnet(
        zone=str(raw.get("AvailabilityZone", "")),
        subnet_id=str(raw.get("SubnetId", "")),
        vpc_id=str(raw.get("VpcId", "")),
    )


def choose_subnet(
    subnets: Sequence[Subnet], zones: Sequence[str], wanted_zone: str, key: str
) -> Subnet | str:
    """The subnet for the instance named ``key``, or the problem (naming the field) when there
    is none to use."""
    if wanted_zone:
        zone, field = wanted_zone, "spec.placement.zone"
    elif zones:
        zone, field = spread(zones, key), "zones"
    else:
        zone, field = "", ""
    candidates = sorted(s for s in subnets if not zone or s.zone == zone)
    if candidates:
        chosen = spread([s.subnet_id for s in candidates], key)
        return next(s for s in candidates if s.subnet_id == chosen)
    known = sorted({s.zone for s in subnets})
    if not zone:
        return "no subnet to launch into: the VPC has none; set subnets (or vpcId) in the config"
    return (
        f"{field}: zone {zone!r} has no subnet to launch into (zones with one: "
        f"{', '.join(known) or 'none'}); list a subnet of {zone} in subnets, or choose another"
    )


# ---------------------------------------------------------------- security group rules

Rule = tuple[str, int, int, str]
"""(protocol, from port, to port, CIDR), CIDR in canonical form."""


def _canonical(cidr: str) -> str:
    try:
        return str(ipaddress.ip_network(cidr, strict=False))
    except ValueError:
        return cidr


def _protocol(value: object) -> str:
    text = str(value).lower()
    return {"6": "tcp", "17": "udp", "1": "icmp", "-1": "-1"}.get(text, text)


def desired_rules(port: int, cidrs: Iterable[str]) -> set[Rule]:
    return {("tcp", port, port, _canonical(c)) for c in cidrs}


def _port(value: object) -> int:
    return value if isinstance(value, int) else -1


@dataclass(frozen=True, slots=True)
class RuleChanges:
    authorize: list[dict[str, Any]]
    revoke: list[dict[str, Any]]

    def __bool__(self) -> bool:
        return bool(self.authorize or self.revoke)


def rule_changes(
    permissions: Sequence[Mapping[str, Any]], port: int, cidrs: Iterable[str]
) -> RuleChanges:
    """What to authorize and what to revoke so the group's ingress is exactly ``cidrs`` on
    TCP ``port``; both as ``IpPermissions`` lists."""
    desired = desired_rules(port, cidrs)
    present: set[Rule] = set()
    revoke: list[dict[str, Any]] = []
    for perm in permissions:
        protocol = _protocol(perm.get("IpProtocol", ""))
        low, high = _port(perm.get("FromPort")), _port(perm.get("ToPort"))
        head: dict[str, Any] = {"IpProtocol": perm.get("IpProtocol", "")}
        if "FromPort" in perm:
            head["FromPort"], head["ToPort"] = perm.get("FromPort"), perm.get("ToPort")
        v4 = [r for r in perm.get("IpRanges") or () if isinstance(r, Mapping)]
        v6 = [r for r in perm.get("Ipv6Ranges") or () if isinstance(r, Mapping)]
        extra_v4 = [
            {"CidrIp": r.get("CidrIp", "")}
            for r in v4
            if (protocol, low, high, _canonical(str(r.get("CidrIp", "")))) not in desired
        ]
        extra_v6 = [
            {"CidrIpv6": r.get("CidrIpv6", "")}
            for r in v6
            if (protocol, low, high, _canonical(str(r.get("CidrIpv6", "")))) not in desired
        ]
        present |= {(protocol, low, high, _canonical(str(r.get("CidrIp", "")))) for r in v4}
        present |= {(protocol, low, high, _canonical(str(r.get("CidrIpv6", "")))) for r in v6}
        others = {
            key: list(perm[key]) for key in ("UserIdGroupPairs", "PrefixListIds") if perm.get(key)
        }
        if extra_v4 or extra_v6 or others:
            revoke.append(
                head
                | ({"IpRanges": extra_v4} if extra_v4 else {})
                | ({"Ipv6Ranges": extra_v6} if extra_v6 else {})
                | others
            )
    return RuleChanges(authorize=permissions_for(desired - present), revoke=revoke)


def permissions_for(rules: Iterable[Rule]) -> list[dict[str, Any]]:
    """``IpPermissions`` for ``rules``, one entry per port range, IPv4 before IPv6."""
    grouped: dict[tuple[str, int, int], list[str]] = {}
    for protocol, low, high, cidr in sorted(rules):
        grouped.setdefault((protocol, low, high), []).append(cidr)
    permissions: list[dict[str, Any]] = []
    for (protocol, low, high), cidrs in grouped.items():
        v4 = [{"CidrIp": c} for c in cidrs if ":" not in c]
        v6 = [{"CidrIpv6": c} for c in cidrs if ":" in c]
        permission: dict[str, Any] = {"IpProtocol": protocol, "FromPort": low, "ToPort": high}
        if v4:
            permission["IpRanges"] = v4
        if v6:
            permission["Ipv6Ranges"] = v6
        permissions.append(permission)
    return permissions


def rules_text(permissions: Iterable[Mapping[str, Any]]) -> str:
    """``IpPermissions`` for a person: ``tcp 3128 from 203.0.113.0/24, 2001:db8::/32``."""
    parts = []
    for perm in permissions:
        low, high = perm.get("FromPort", -1), perm.get("ToPort", -1)
        ports = "all ports" if low in (-1, None) else str(low) if low == high else f"{low}-{high}"
        sources = [str(r.get("CidrIp", "")) for r in perm.get("IpRanges") or ()]
        sources += [str(r.get("CidrIpv6", "")) for r in perm.get("Ipv6Ranges") or ()]
        sources += [str(g.get("GroupId", "")) for g in perm.get("UserIdGroupPairs") or ()]
        sources += [str(g.get("PrefixListId", "")) for g in perm.get("PrefixListIds") or ()]
        protocol = _protocol(perm.get("IpProtocol", ""))
        parts.append(
            f"{'any protocol' if protocol == '-1' else protocol} {ports} from "
            f"{', '.join(sources) or 'nowhere'}"
        )
    return "; ".join(parts)
