"""The ``aws`` provider: EC2 instances with a public IPv4 address, one per Proxy.

Every call is fire-and-forget: ``create`` returns once EC2 has accepted the launch and the
reconciler follows progress by polling ``get``; nothing waits for an instance, so a crash loses
nothing. A create is idempotent on the instance name (the ``Name`` tag): it first looks for a
live instance of that name, under a lock per name in the process, and remembers for a minute
the ids it launched, because DescribeInstances is eventually consistent and may not show a
launch that just happened. No ClientToken: EC2 would answer a repeated token with the
terminated instance, and a create after a delete must make a new one
(docs/providers.md, "aws").

Instances launch into one subnet (``pure/network.py`` chooses it), with the entry's security
group (``firewall.py``) on their one network interface and a public address asked for there,
whatever the subnet's own default. The group is the only resource that outlives instances; GC
finds it through ``leftovers`` once the entry has no instance left.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Mapping
from typing import Any

import structlog

from services.providers.aws.catalogue import Catalogue
from services.providers.aws.client import Ec2, error_code
from services.providers.aws.config import (
    AwsConfig,
    image_problem,
    instance_type_problem,
    zone_problem,
)
from services.providers.aws.firewall import SecurityGroup
from services.providers.aws.preflight import check_entry
from services.providers.aws.pure import mapping, network
from services.providers.aws.pure.launch import Launch
from services.providers.base import (
    CREATED_AT_LABEL,
    CreateRequest,
    Instance,
    Leftover,
    NotFound,
    Permanent,
    ProviderError,
)
from services.providers.cloud.names import NameLocks
from services.providers.cloud.pure.leftovers import firewall_id_of, firewall_leftovers
from services.providers.cloud.pure.userdata import vm_user_data
from services.providers.preflight import Finding

__all__ = ["AwsConfig", "AwsProvider"]

log = structlog.get_logger("egress.provider.aws")

MAX_USER_DATA = 16 * 1024
"""EC2's limit on user data, before base64."""
RECENT_SECONDS = 60.0
"""How long a launched id is returned to a repeated create that DescribeInstances does not
answer yet (its eventual consistency is seconds, rarely more)."""


class AwsProvider:
    """A ``Provider`` and ``LeftoverCleaner``; see the module docstring."""

    type = "aws"

    def __init__(self, name: str, config: AwsConfig) -> None:
        self.name = name
        self.config = config
        self.ec2 = Ec2(name, config)
        self.firewall = SecurityGroup(self.ec2)
        self.catalogue = Catalogue(self.ec2)
        self._network: tuple[str, list[network.Subnet]] | None = None
        self._network_lock = asyncio.Lock()
        self._names = NameLocks()
        self._recent: dict[str, tuple[str, float]] = {}

    @classmethod
    def from_config(cls, name: str, config: AwsConfig) -> AwsProvider:
        return cls(name, config)

    def __repr__(self) -> str:
        return f"AwsProvider({self.name!r}, region={self.config.region!r})"

    # ---------------------------------------------------------------- Provider

    async def create(self, request: CreateRequest) -> str:
        launch = self._launch(request)
        what = f"{self.name}: create {request.name}"
        async with self._names.held(request.name):
            found = await self._namesake(request.name)
            if found:
                return found
            vpc_id, subnets = await self.vpc()
            subnets, zones = await self.catalogue.usable(launch, subnets, what)
            subnet = network.choose_subnet(subnets, zones, launch.zone, request.name)
            if isinstance(subnet, str):
                raise Permanent(f"{what}: {subnet}")
            group_id = await self.firewall.ensure(vpc_id)
            try:
                answer = await self.ec2.call(
                    "create", what, "run_instances", **launch.params(subnet, group_id, self.config)
                )
            except ProviderError as exc:
                code = error_code(exc.__cause__ or exc)
                if code == "InvalidGroup.NotFound":
                    self.firewall.forget(group_id)  # made again by the next try
                elif code.startswith(("InvalidSubnet", "InvalidVpc")):
                    self._network = None
                elif code == "Unsupported":  # the type, in this zone: the catalogue changed?
                    raise await self.catalogue.refused(launch, subnet.zone, exc) from exc.__cause__
                raise
            provider_id = str(answer["Instances"][0]["InstanceId"])
            self._remember(request.name, provider_id)
            log.info(
                "instance launch accepted",
                provider=self.name,
                id=provider_id,
                name=request.name,
                zone=subnet.zone,
                subnet=subnet.subnet_id,
            )
            return provider_id

    async def get(self, provider_id: str) -> Instance:
        what = f"{self.name}: get {provider_id}"
        if not mapping.INSTANCE_ID.match(provider_id):
            raise NotFound(f"{what}: not an EC2 instance id this provider issues")
        answer = await self.ec2.call("get", what, "describe_instances", InstanceIds=[provider_id])
        found = [
            raw
            for raw in mapping.instances_of([answer])
            if raw.get("InstanceId") == provider_id
            and (raw.get("State") or {}).get("Name") != "terminated"
        ]
        if not found:
            self._forget(provider_id)
            raise NotFound(f"{what}: terminated or gone")
        return mapping.to_instance(found[0], self.config.proxy_port)

    async def delete(self, provider_id: str) -> None:
        if not mapping.INSTANCE_ID.match(provider_id):
            return  # could never have been created
        self._forget(provider_id)
        try:
            await self.ec2.call(
                "delete",
                f"{self.name}: delete {provider_id}",
                "terminate_instances",
                InstanceIds=[provider_id],
            )
        except NotFound:
            return
        log.info("instance termination accepted", provider=self.name, id=provider_id)

    async def list_by_tag(self) -> list[Instance]:
        return [mapping.to_instance(raw, self.config.proxy_port) for raw in await self._instances()]

    async def close(self) -> None:
        await self.ec2.close()

    async def preflight(self) -> list[Finding]:
        """The ``Preflight`` capability: ``preflight.py`` says what is checked."""
        return await check_entry(self)

    # ---------------------------------------------------------------- LeftoverCleaner

    async def leftovers(self) -> list[Leftover]:
        """The entry's security groups, once it has no instance left in any state but
        terminated (one shutting down still holds its group)."""
        if await self._instances():
            return []
        return firewall_leftovers(
            self.name,
            (
                (
                    str(group.get("GroupId", "")),
                    mapping.parse_time(mapping.tags_of(group).get(CREATED_AT_LABEL)),
                )
                for group in await self.firewall.listing()
            ),
        )

    async def delete_leftover(self, leftover: Leftover) -> bool:
        """Delete a reported security group unless the entry has an instance again (False)."""
        group_id = firewall_id_of(self.name, leftover, _group_id, "sg-... (a security group)")
        if await self._instances():
            return False
        return await self.firewall.delete(group_id)

    # ---------------------------------------------------------------- internals

    def _launch(self, request: CreateRequest) -> Launch:
        """A spec EC2 would refuse fails here, Permanent, naming the field."""
        config, placement = self.config, request.spec.placement
        where = f"{self.name}: create {request.name}"
        if placement.region and placement.region != config.region:
            raise Permanent(
                f"{where}: spec.placement.region {placement.region!r}: this provider entry "
                f"launches in {config.region}; use an entry for {placement.region} or leave "
                "the region out"
            )
        instance_type = placement.machine_type or config.instance_type
        type_field = "spec.placement.machineType" if placement.machine_type else "instanceType"
        image = placement.image or config.image
        problem = (
            (
                zone_problem(placement.zone, config.region, "spec.placement.zone")
                if placement.zone
                else ""
            )
            or instance_type_problem(instance_type, "spec.placement.machineType")
            or image_problem(image, "spec.placement.image")
        )
        tags = mapping.instance_tags(
            request.name,
            request.owner_uid,
            self.name,
            request.spec_hash,
            namespace=request.namespace,
            proxy_name=request.proxy_name,
        )
        problem = problem or mapping.tag_problem(tags)
        if problem:
            raise Permanent(f"{where}: {problem}")
        try:
            request.cloud_init.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise Permanent(
                f"{where}: spec.cloudInit has a character UTF-8 cannot encode at {exc.start}"
            ) from exc
        user_data = vm_user_data(request.cloud_init, config, self.name).encode("utf-8")
        if len(user_data) > MAX_USER_DATA:
            # cloud-init reads gzip-compressed user data as it reads plain: the lease helper
            # and the guard part (D134) together pass EC2's limit, compressed they fit.
            user_data = gzip.compress(user_data, mtime=0)
        size = len(user_data)
        if size > MAX_USER_DATA:
            raise Permanent(
                f"{where}: the user data is {size} bytes gzip-compressed; EC2 takes at most "
                f"{MAX_USER_DATA}: "
                "shorten spec.cloudInit (or set installSquid: false and bake Squid into the image)"
            )
        return Launch(placement.zone, instance_type, type_field, image, tags, user_data)

    async def _instances(self) -> list[Mapping[str, Any]]:
        """Every instance of this entry but the terminated ones."""
        pages = await self.ec2.pages(
            "list",
            f"{self.name}: list instances",
            "describe_instances",
            Filters=mapping.managed_filters(self.name),
        )
        return mapping.instances_of(pages)

    async def _namesake(self, name: str) -> str:
        """The live instance a previous create of ``name`` made, or ``""``."""
        pages = await self.ec2.pages(
            "list",
            f"{self.name}: find instance {name}",
            "describe_instances",
            Filters=mapping.namesake_filters(self.name, name),
        )
        found = sorted(
            mapping.instances_of(pages),
            key=lambda raw: (mapping.parse_time(raw.get("LaunchTime")), str(raw["InstanceId"])),
        )
        if found:
            return str(found[0]["InstanceId"])
        now = asyncio.get_running_loop().time()
        self._recent = {
            n: (pid, at) for n, (pid, at) in self._recent.items() if now - at < RECENT_SECONDS
        }
        recent = self._recent.get(name, ("", 0.0))[0]
        if recent and not await self._still_launching(recent):
            self._forget(recent)
            return ""
        return recent

    async def _still_launching(self, provider_id: str) -> bool:
        """Whether an id this process launched moments ago, which the name lookup does not
        show, is still to be returned: yes while EC2 does not know it yet (eventual
        consistency) or shows it live, no once it is on its way out or gone."""
        try:
            answer = await self.ec2.call(
                "get",
                f"{self.name}: get {provider_id}",
                "describe_instances",
                InstanceIds=[provider_id],
            )
        except NotFound:
            return True
        states = {
            str((raw.get("State") or {}).get("Name", ""))
            for raw in mapping.instances_of([answer])
            if raw.get("InstanceId") == provider_id
        }
        return bool(states) and states <= set(mapping.NAMESAKE_STATES)

    def _remember(self, name: str, provider_id: str) -> None:
        self._recent[name] = (provider_id, asyncio.get_running_loop().time())

    def _forget(self, provider_id: str) -> None:
        self._recent = {n: v for n, v in self._recent.items() if v[0] != provider_id}

    async def vpc(self) -> tuple[str, list[network.Subnet]]:
        """The VPC and the subnets to launch into, described once and kept."""
        async with self._network_lock:
            if self._network is None:
                self._network = await self._describe_network()
            return self._network

    async def _describe_network(self) -> tuple[str, list[network.Subnet]]:
        config, what = self.config, f"{self.name}: describe the network"
        if config.subnets:
            answer = await self.ec2.call(
                "create", what, "describe_subnets", SubnetIds=list(config.subnets)
            )
            subnets = [network.subnet_of(s) for s in answer.get("Subnets") or ()]
            vpcs = sorted({s.vpc_id for s in subnets})
            if len(vpcs) != 1 or (config.vpc_id and vpcs != [config.vpc_id]):
                raise Permanent(
                    f"{what}: subnets are in VPCs {', '.join(vpcs) or 'none'}"
                    f"{f', not vpcId {config.vpc_id}' if config.vpc_id else ''}: list subnets "
                    "of one VPC (the one vpcId names)"
                )
            return vpcs[0], subnets
        vpc_id = config.vpc_id
        filters: list[dict[str, Any]] = [{"Name": "state", "Values": ["available"]}]
        if not vpc_id:
            answer = await self.ec2.call(
                "create",
                what,
                "describe_vpcs",
                Filters=[{"Name": "is-default", "Values": ["true"]}],
            )
            defaults = answer.get("Vpcs") or []
            if not defaults:
                raise Permanent(
                    f"{what}: region {config.region} has no default VPC; set vpcId (and "
                    "subnets) in the config"
                )
            vpc_id = str(defaults[0]["VpcId"])
            filters.append({"Name": "default-for-az", "Values": ["true"]})
        filters.append({"Name": "vpc-id", "Values": [vpc_id]})
        pages = await self.ec2.pages("create", what, "describe_subnets", Filters=filters)
        return vpc_id, [network.subnet_of(s) for page in pages for s in page.get("Subnets") or ()]


def _group_id(provider_id: str) -> str | None:
    return provider_id if mapping.GROUP_ID.match(provider_id) else None
