"""EC2's catalogue of one provider entry, read before a launch and by the preflight, and kept
(``pure/catalogue.py`` for why and for how long;
docs/decisions/0143-aws-checks-its-catalogue-before-a-launch.md).

One DescribeInstanceTypeOfferings per instance type answers the zones of the entry's region
offering it; a create launches only into those (``usable``), and a launch EC2 refuses as
``Unsupported`` all the same drops the kept answer (``refused``). Only when no zone offers the
type are the other regions asked (DescribeRegions, then one region-level offering call per
region, a few at a time), so the refusal can say where the type would work; that answer is kept
as long.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from services.providers.aws.client import Ec2, error_code
from services.providers.aws.pure import catalogue
from services.providers.aws.pure.catalogue import MAX_TYPES, offered_locations
from services.providers.aws.pure.launch import Launch
from services.providers.aws.pure.network import Subnet
from services.providers.base import Permanent, ProviderError, Transient
from services.providers.cloud.pure.expiring import Expiring

log = structlog.get_logger("egress.provider.aws")

PARALLEL_REGIONS = 8
"""Other regions asked at once (each through a client of its own)."""


class Catalogue:
    def __init__(self, ec2: Ec2, clock: Callable[[], float] = time.monotonic) -> None:
        self.ec2 = ec2
        self.clock = clock
        self._zones: Expiring[str, frozenset[str]] = Expiring(size=MAX_TYPES)
        # Wrapped in a 1-tuple: a kept "could not be asked" (None) is not a missing entry.
        self._regions: Expiring[str, tuple[tuple[str, ...] | None]] = Expiring(size=MAX_TYPES)
        self._lock = asyncio.Lock()

    async def usable(
        self, launch: Launch, subnets: list[Subnet], what: str
    ) -> tuple[list[Subnet], tuple[str, ...]]:
        """The subnets, and the listed zones, whose zone offers the launch's instance type; a
        type the zones cannot run is Permanent naming the field and where it would work. A
        policy without DescribeInstanceTypeOfferings launches unchecked (EC2's own refusal
        still says it), as before this check existed."""
        config = self.ec2.config
        candidates = config.zones or tuple(sorted({s.zone for s in subnets}))
        if not (launch.zone or candidates) or (
            launch.zone and all(s.zone != launch.zone for s in subnets)
        ):
            return subnets, config.zones  # no subnet there: choose_subnet says so
        try:
            offered = await self.zones(launch.instance_type)
        except ProviderError as exc:
            if error_code(exc.__cause__ or exc) != "UnauthorizedOperation":
                raise
            log.warning(
                "instance type not checked", provider=self.ec2.provider_name, error=str(exc)
            )
            return subnets, config.zones
        chosen = catalogue.placement(
            launch.instance_type,
            launch.type_field,
            region=config.region,
            wanted_zone=launch.zone,
            candidates=candidates,
            offered=offered,
        )
        if chosen.problem:
            more = ""
            if not offered:
                regions = await self.regions(launch.instance_type)
                more = f"; {catalogue.elsewhere(regions, launch.instance_type)}"
            raise Permanent(f"{what}: {chosen.problem}{more}")
        return [s for s in subnets if s.zone in offered], tuple(
            z for z in config.zones if z in offered
        )

    async def refused(self, launch: Launch, zone: str, exc: ProviderError) -> ProviderError:
        """What a launch EC2 refused as ``Unsupported`` in ``zone`` raises. The kept catalogue
        offered the type there, so it is read again: Transient when it no longer does (the
        next try places the instance by the new answer), Permanent when it still does or
        cannot be read (a retry would be refused the same way), naming the field."""
        self.forget(launch.instance_type)
        try:
            offered = await self.zones(launch.instance_type)
        except ProviderError:
            offered = frozenset({zone})
        said = f"{exc} ({launch.type_field} {launch.instance_type} in {zone})"
        if zone in offered:
            return Permanent(f"{said}; `egress-proxies providers check` says where it runs")
        return Transient(f"{said}; EC2's catalogue changed: the next try places it again")

    def forget(self, instance_type: str) -> None:
        """Drop what is kept about ``instance_type``: EC2 just refused a launch of it."""
        self._zones.forget(instance_type)
        self._regions.forget(instance_type)

    async def zones(self, instance_type: str, op: str = "create") -> frozenset[str]:
        """The zones of the entry's region offering ``instance_type``."""
        async with self._lock:
            kept = self._zones.get(instance_type, self.clock())
            if kept is not None:
                return kept
            pages = await self.ec2.pages(
                op,
                f"{self.ec2.provider_name}: where {instance_type} is offered",
                "describe_instance_type_offerings",
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": [instance_type]}],
            )
            found = offered_locations(pages, instance_type)
            self._zones.put(instance_type, found, self.clock())
            return found

    async def regions(self, instance_type: str) -> tuple[str, ...] | None:
        """The other regions of the account offering ``instance_type``, sorted; None when they
        could not be asked (a policy without DescribeRegions, an endpoint for one region)."""
        kept = self._regions.get(instance_type, self.clock())
        if kept is not None:
            return kept[0]
        config = self.ec2.config
        try:
            answer = await self.ec2.call(
                "list", f"{self.ec2.provider_name}: list regions", "describe_regions"
            )
        except ProviderError as exc:
            log.info("regions not listed", provider=self.ec2.provider_name, error=str(exc))
            return None
        names = sorted(
            str(r.get("RegionName") or "")
            for r in answer.get("Regions") or ()
            if r.get("RegionName") and r.get("RegionName") != config.region
        )
        gate = asyncio.Semaphore(PARALLEL_REGIONS)

        async def offers(region: str) -> bool | None:
            other = self.ec2.in_region(region)
            try:
                async with gate:
                    pages = await other.pages(
                        "list",
                        f"{self.ec2.provider_name}: is {instance_type} offered in {region}",
                        "describe_instance_type_offerings",
                        LocationType="region",
                        Filters=[{"Name": "instance-type", "Values": [instance_type]}],
                    )
                return region in offered_locations(pages, instance_type)
            except ProviderError:
                return None
            finally:
                await other.close()

        answers = await asyncio.gather(*(offers(r) for r in names))
        found: tuple[str, ...] | None = tuple(
            r for r, yes in zip(names, answers, strict=True) if yes
        )
        if names and all(a is None for a in answers):
            found = None
        self._regions.put(instance_type, (found,), self.clock())
        return found
