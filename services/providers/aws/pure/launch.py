"""What a launch asks EC2 for: the checked parts of a create, and the RunInstances parameters
made of them, shared by ``create`` and the preflight's dry run (so the dry run asks exactly what
a create would)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.providers.aws.config import AwsConfig
from services.providers.aws.pure import mapping
from services.providers.aws.pure.network import Subnet


@dataclass(frozen=True, slots=True)
class Launch:
    """What a create asks for, checked before any call. ``type_field`` names where the
    instance type came from (``instanceType`` or ``spec.placement.machineType``), for errors."""

    zone: str
    instance_type: str
    type_field: str
    image: str
    tags: dict[str, str]
    user_data: bytes

    def params(self, subnet: Subnet, group_id: str, config: AwsConfig) -> dict[str, Any]:
        """RunInstances' parameters; ``group_id`` empty (a dry run before the group exists):
        the interface is given none."""
        tags = mapping.tag_list(self.tags)
        interface: dict[str, Any] = {
            "DeviceIndex": 0,
            "SubnetId": subnet.subnet_id,
            "AssociatePublicIpAddress": True,
            "DeleteOnTermination": True,
        }
        if group_id:
            interface["Groups"] = [group_id]
        params: dict[str, Any] = {
            "ImageId": self.image,
            "InstanceType": self.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "UserData": self.user_data,
            "NetworkInterfaces": [interface],
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
            # IMDSv2 only, one hop: a token PUT relayed by anything on the VM (its Squid, a
            # container) gets no answer back, beside the guard's firewall rule (D134).
            "MetadataOptions": {
                "HttpTokens": "required",
                "HttpPutResponseHopLimit": 1,
                "HttpEndpoint": "enabled",
            },
            # A VM that powers itself off is replaced anyway; stopped, it would still bill its
            # disk until the reconciler noticed.
            "InstanceInitiatedShutdownBehavior": "terminate",
        }
        if config.key_name:
            params["KeyName"] = config.key_name
        if config.spot:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                },
            }
        return params
