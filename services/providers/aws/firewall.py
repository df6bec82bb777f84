"""The one security group of a provider entry (``cloud/pure/firewall.py``): made at the first
create when missing, its ingress made exactly ``allowedClients`` on ``proxyPort``, attached to
every instance at launch, and deleted by GC once no instance of the entry is left.

The group is found by name in the VPC (a name is unique per VPC, so two processes racing to make
it end with one: the loser's ``InvalidGroup.Duplicate`` sends it to look again). Its id is kept
once checked; a launch answering ``InvalidGroup.NotFound`` (GC or a person deleted it) makes the
provider forget it, and the next create makes it again. AWS records no creation time for a
security group, so the group carries its own in a tag (``egress-proxies/created-at``); one
without it counts as old.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import structlog

from services.providers.aws.client import Ec2, error_code
from services.providers.aws.pure import mapping, network
from services.providers.base import MANAGED_LABEL, Permanent, ProviderError
from services.providers.cloud.pure.firewall import firewall_name, firewall_owner
from services.providers.cloud.pure.settings import client_networks

log = structlog.get_logger("egress.provider.aws")

DESCRIPTION = "egress-proxies: the proxy port, open to allowedClients only"


class SecurityGroup:
    def __init__(self, ec2: Ec2) -> None:
        self.ec2 = ec2
        self.provider_name = ec2.provider_name
        self.name = firewall_name(self.provider_name)
        self.group_id = ""
        self._lock = asyncio.Lock()

    def forget(self, group_id: str = "") -> None:
        """Drop the kept id (only if it is ``group_id``, when given): the group is gone."""
        if not group_id or group_id == self.group_id:
            self.group_id = ""

    async def ensure(self, vpc_id: str) -> str:
        """The group's id in ``vpc_id``, made or brought back to exactly the configured rules."""
        async with self._lock:
            if self.group_id:
                return self.group_id
            group = await self.find(vpc_id)
            if group is None:
                group = await self._make(vpc_id)
            await self._reconcile(group)
            self.group_id = str(group["GroupId"])
            return self.group_id

    async def find(self, vpc_id: str) -> dict[str, object] | None:
        """The group as EC2 describes it, or None when ``vpc_id`` has none of this name."""
        answer = await self.ec2.call(
            "firewall",
            f"{self.provider_name}: find security group {self.name}",
            "describe_security_groups",
            Filters=[
                {"Name": "group-name", "Values": [self.name]},
                {"Name": "vpc-id", "Values": [vpc_id]},
            ],
        )
        groups = answer.get("SecurityGroups") or []
        return groups[0] if groups else None

    async def _make(self, vpc_id: str) -> dict[str, object]:
        tags = mapping.firewall_tags(
            self.name, firewall_owner(self.provider_name), self.provider_name, datetime.now(UTC)
        )
        what = f"{self.provider_name}: create security group {self.name} in {vpc_id}"
        try:
            made = await self.ec2.call(
                "firewall",
                what,
                "create_security_group",
                GroupName=self.name,
                Description=DESCRIPTION,
                VpcId=vpc_id,
                TagSpecifications=[
                    {"ResourceType": "security-group", "Tags": mapping.tag_list(tags)}
                ],
            )
        except ProviderError as exc:
            if error_code(exc.__cause__ or exc) != "InvalidGroup.Duplicate":
                raise
            found = await self.find(vpc_id)  # made meanwhile by another process
            if found is None:
                raise
            return found
        log.info(
            "security group made",
            provider=self.provider_name,
            group=made.get("GroupId"),
            vpc=vpc_id,
        )
        return {"GroupId": made["GroupId"], "IpPermissions": []}

    async def _reconcile(self, group: dict[str, object]) -> None:
        group_id = str(group["GroupId"])
        permissions = group.get("IpPermissions") or []
        assert isinstance(permissions, list)
        changes = network.rule_changes(
            permissions, self.ec2.config.proxy_port, client_networks(self.ec2.config)
        )
        what = f"{self.provider_name}: set the rules of security group {group_id}"
        if changes.revoke:
            await self.ec2.call(
                "firewall",
                what,
                "revoke_security_group_ingress",
                GroupId=group_id,
                IpPermissions=changes.revoke,
            )
        if changes.authorize:
            await self.ec2.call(
                "firewall",
                what,
                "authorize_security_group_ingress",
                GroupId=group_id,
                IpPermissions=changes.authorize,
            )
        if changes:
            log.info(
                "security group rules set",
                provider=self.provider_name,
                group=group_id,
                authorized=len(changes.authorize),
                revoked=len(changes.revoke),
            )

    async def listing(self) -> list[dict[str, object]]:
        """Every group of this entry, in any VPC."""
        pages = await self.ec2.pages(
            "leftovers",
            f"{self.provider_name}: list security groups",
            "describe_security_groups",
            Filters=mapping.group_filters(self.provider_name),
        )
        return [g for page in pages for g in page.get("SecurityGroups") or ()]

    async def delete(self, group_id: str) -> bool:
        """Delete one group of this entry: True once gone (already gone included), False when
        an instance still uses it (``DependencyViolation``). A group that is not this entry's
        is never touched."""
        what = f"{self.provider_name}: delete security group {group_id}"
        try:
            answer = await self.ec2.call(
                "leftovers", what, "describe_security_groups", GroupIds=[group_id]
            )
        except ProviderError as exc:
            if error_code(exc.__cause__ or exc) == "InvalidGroup.NotFound":
                self.forget(group_id)
                return True
            raise
        groups = answer.get("SecurityGroups") or []
        if not groups:
            self.forget(group_id)
            return True
        tags = mapping.tags_of(groups[0])
        if tags.get(MANAGED_LABEL) != "true" or tags.get(mapping.PROVIDER_LABEL) != (
            self.provider_name
        ):
            raise Permanent(
                f"{what}: the group is not tagged as this entry's "
                f"({mapping.PROVIDER_LABEL}={self.provider_name}); it is left alone"
            )
        async with self._lock:
            try:
                await self.ec2.call("leftovers", what, "delete_security_group", GroupId=group_id)
            except ProviderError as exc:
                code = error_code(exc.__cause__ or exc)
                if code == "DependencyViolation":
                    return False
                if code != "InvalidGroup.NotFound":
                    raise
            self.forget(group_id)
        log.info("security group deleted", provider=self.provider_name, group=group_id)
        return True
