"""What an aws launch sends and where it goes, against moto's EC2 emulator: tags, the network
interface and its group, the default type and image, spot (and what an interruption looks like),
zones, subnets and placement, and the specs refused before any call."""

from __future__ import annotations

import base64
import random
from typing import Any

import pytest

from events.schemas import InstanceState, Placement
from services.providers.aws.provider import AwsProvider
from services.providers.base import MANAGED_LABEL, OWNER_LABEL, NotFound, Permanent
from services.testing.aws import FaultFront
from tests.contract.provider import (
    delete_all,
    owned,
)
from tests.support.aws_support import *  # noqa: F403  # pytest finds fixtures by name here
from tests.support.aws_support import PROVIDER, config, described, request

pytestmark = pytest.mark.integration


async def test_a_launch_carries_tags_user_data_network_and_the_default_type(
    aws: AwsProvider, front: FaultFront, ec2: Any, image: str
) -> None:
    pid = await aws.create(request("px-body", owner_uid="8d3c7a2e-0001", cloud_init="#!/bin/sh\n"))
    raw = described(ec2, pid)
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags == {
        "Name": "px-body",
        MANAGED_LABEL: "true",
        OWNER_LABEL: "8d3c7a2e-0001",
        "egress-proxies/provider": PROVIDER,
        "egress-proxies/spec-hash": "abc123",
        # The proxy's namespace and name, for the console.
        "egress-proxies/namespace": "crawl",
        "egress-proxies/name": "px-body",
    }
    assert (raw["InstanceType"], raw["ImageId"]) == ("t3.nano", image)
    assert "InstanceLifecycle" not in raw  # on-demand unless spot: true
    (nic,) = raw["NetworkInterfaces"]
    assert [g["GroupName"] for g in nic["Groups"]] == ["egress-proxies-aws-eu"]
    (sent,) = [b for b in front.bodies if b["Action"] == ["RunInstances"]]
    assert sent["NetworkInterface.1.AssociatePublicIpAddress"] == ["true"]
    assert sent["MetadataOptions.HttpTokens"] == ["required"]
    # IMDSv2 only, one hop, asked for (not left to the AMI's default, which may be 2):
    # nothing relayed from the VM gets a token back (D134).
    assert sent["MetadataOptions.HttpPutResponseHopLimit"] == ["1"]
    options = raw["MetadataOptions"]
    assert (options["HttpTokens"], options["HttpPutResponseHopLimit"]) == ("required", 1)
    assert options["HttpEndpoint"] == "enabled"
    assert "KeyName" not in sent
    assert "InstanceMarketOptions.MarketType" not in sent


async def test_spot_instances_and_what_an_interruption_looks_like(
    front: FaultFront, ec2: Any, image: str
) -> None:
    ec2.create_key_pair(KeyName="ops")
    provider = AwsProvider(PROVIDER, config(front.url, image, spot=True, keyName="ops"))
    nokey = AwsProvider(PROVIDER, config(front.url, image, keyName="nobody"))
    try:
        with pytest.raises(Permanent, match=r"InvalidKeyPair\.NotFound"):
            await nokey.create(request("px-nokey"))
        first = await provider.create(request("px-spot-1"))
        second = await provider.create(request("px-spot-2"))
        assert described(ec2, first)["InstanceLifecycle"] == "spot"
        sent = [b for b in front.bodies if b["Action"] == ["RunInstances"]][-1]
        assert sent["InstanceMarketOptions.MarketType"] == ["spot"]
        assert sent["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == ["one-time"]
        assert sent["KeyName"] == ["ops"]
        assert (await provider.get(first)).state is InstanceState.RUNNING
        ec2.stop_instances(InstanceIds=[first])  # interrupted with behaviour stop
        stopped = await provider.get(first)
        assert (stopped.state, stopped.ip) == (InstanceState.STOPPED, "")
        ec2.terminate_instances(InstanceIds=[second])  # interrupted with behaviour terminate
        with pytest.raises(NotFound):
            await provider.get(second)
        assert [i.provider_id for i in await provider.list_by_tag()] == [first]
    finally:
        await delete_all(provider)
        await provider.close()
        await nokey.close()


async def test_placement_and_zones_choose_the_subnet(
    front: FaultFront, ec2: Any, image: str
) -> None:
    zones = ["eu-west-1a", "eu-west-1b"]
    async with owned(AwsProvider(PROVIDER, config(front.url, image, zones=zones))) as provider:
        placed = {}
        for n in range(8):
            pid = await provider.create(request(f"px-z{n}"))
            placed[pid] = described(ec2, pid)["Placement"]["AvailabilityZone"]
        assert set(placed.values()) == set(zones)  # spread, by name
        pid = await provider.create(
            request("px-c", placement=Placement(zone="eu-west-1c", machine_type="t3.micro"))
        )
        raw = described(ec2, pid)
        assert (raw["Placement"]["AvailabilityZone"], raw["InstanceType"]) == (
            "eu-west-1c",
            "t3.micro",
        )
        before = len(front.actions)
        with pytest.raises(
            Permanent, match=r"spec\.placement\.zone: zone 'eu-west-1d' has no subnet"
        ):
            await provider.create(request("px-d", placement=Placement(zone="eu-west-1d")))
        assert "RunInstances" not in front.actions[before:]


async def test_listed_subnets_are_the_only_ones_used(
    front: FaultFront, ec2: Any, image: str
) -> None:
    subnets = ec2.describe_subnets(
        Filters=[{"Name": "availability-zone", "Values": ["eu-west-1b"]}]
    )["Subnets"]
    chosen = subnets[0]["SubnetId"]
    provider = AwsProvider(PROVIDER, config(front.url, image, subnets=[chosen]))
    unknown = AwsProvider(PROVIDER, config(front.url, image, subnets=["subnet-0123456789abcdef0"]))
    try:
        for n in range(3):
            pid = await provider.create(request(f"px-s{n}"))
            assert described(ec2, pid)["SubnetId"] == chosen
        with pytest.raises(Permanent, match=r"InvalidSubnetID\.NotFound"):
            await unknown.create(request("px-nosubnet"))
    finally:
        await delete_all(provider)
        await provider.close()
        await unknown.close()


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        (Placement(region="us-east-1"), "spec.placement.region 'us-east-1'"),
        (Placement(zone="us-east-1a"), "spec.placement.zone 'us-east-1a'"),
        (Placement(machine_type="T3 Nano"), "spec.placement.machineType 'T3 Nano'"),
        (Placement(image="debian-12"), "spec.placement.image 'debian-12'"),
    ],
)
async def test_bad_specs_fail_before_any_call(
    aws: AwsProvider, front: FaultFront, ec2: Any, placement: Placement, message: str
) -> None:
    with pytest.raises(Permanent, match=message):
        await aws.create(request("px-bad", placement=placement))
    assert front.actions == []


async def test_bad_tags_and_oversized_user_data_fail_before_any_call(
    aws: AwsProvider, front: FaultFront, ec2: Any
) -> None:
    with pytest.raises(Permanent, match="tag egress-proxies/owner-uid"):
        await aws.create(request("px-t", owner_uid="owner\nuid"))
    with pytest.raises(Permanent, match="tag egress-proxies/owner-uid is 300 characters"):
        await aws.create(request("px-t", owner_uid="o" * 300))
    with pytest.raises(Permanent, match=r"spec\.cloudInit has a character UTF-8 cannot encode"):
        await aws.create(request("px-t", cloud_init="#!/bin/sh\necho \ud800\n"))
    # Random text: even gzip-compressed it passes EC2's limit.
    noise = base64.b64encode(random.Random(7).randbytes(24_000)).decode()
    with pytest.raises(
        Permanent, match=r"user data is \d+ bytes gzip-compressed; EC2 takes at most 16384"
    ):
        await aws.create(request("px-t", cloud_init="#!/bin/sh\n# " + noise + "\n"))
    assert front.actions == []
