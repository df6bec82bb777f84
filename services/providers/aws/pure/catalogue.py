"""Where an instance type is offered, read from EC2's catalogue
(``DescribeInstanceTypeOfferings``), and what that leaves a launch
(docs/decisions/0143-aws-checks-its-catalogue-before-a-launch.md).

EC2 offers a type per availability zone, not per region: ``t3.nano`` is missing from some zones
of us-east-1, and a launch into a subnet of such a zone answers ``Unsupported``. A config whose
type no zone it uses offers can never create; one where some zones lack it works in the others.
These functions decide which, and word the refusal with the field and where the type would work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_TYPES = 64
"""Instance types kept at once: a config names one or two; Proxies may name a few more. Each
answer is believed an hour (``cloud.pure.expiring``): EC2 adds and removes a type in a zone
rarely, and a stale answer costs one refused launch (which drops it) at worst."""


def offered_locations(pages: Iterable[Mapping[str, Any]], instance_type: str) -> frozenset[str]:
    """The locations (zones or regions) of ``instance_type`` in DescribeInstanceTypeOfferings
    pages."""
    return frozenset(
        str(offer.get("Location") or "")
        for page in pages
        for offer in page.get("InstanceTypeOfferings") or ()
        if offer.get("InstanceType") == instance_type and offer.get("Location")
    )


@dataclass(frozen=True, slots=True)
class Placement:
    """The zones a launch may use, or the problem (naming the field) when none would work."""

    zones: tuple[str, ...] = ()
    problem: str = ""


def placement(
    instance_type: str,
    type_field: str,
    *,
    region: str,
    wanted_zone: str,
    candidates: Sequence[str],
    offered: frozenset[str],
) -> Placement:
    """Where ``instance_type`` may launch: ``wanted_zone`` (``spec.placement.zone``) when it
    offers the type, else the ``candidates`` (the zones listed, or those with a subnet) that
    offer it. ``problem`` names the field at fault and the zones that would work."""
    where = _where(offered, region)
    if wanted_zone:
        if wanted_zone in offered:
            return Placement((wanted_zone,))
        return Placement(
            problem=f"spec.placement.zone {wanted_zone}: {type_field} {instance_type} is not "
            f"offered in that zone; {where}"
        )
    usable = tuple(z for z in candidates if z in offered)
    if usable:
        return Placement(usable)
    return Placement(
        problem=f"{type_field} {instance_type} is not offered in "
        f"{_zones(candidates) or 'any zone with a subnet'} of {region}; {where}"
    )


def elsewhere(regions: Sequence[str] | None, instance_type: str) -> str:
    """The sentence naming other regions offering a type none of the entry's region's zones
    offers (None: they could not be asked)."""
    if regions is None:
        return f"other regions could not be asked whether they offer {instance_type}"
    if not regions:
        return f"no region of this account offers {instance_type}"
    return f"regions offering {instance_type}: {', '.join(regions)} (an entry per region)"


def _where(offered: frozenset[str], region: str) -> str:
    if offered:
        return (
            f"it is offered in {_zones(sorted(offered))}: place instances there (zones, "
            "subnets or spec.placement.zone), or choose another type"
        )
    return f"no zone of {region} offers it: choose another type, or an entry for another region"


def _zones(zones: Iterable[str]) -> str:
    return ", ".join(zones)
