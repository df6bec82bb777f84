"""An instance type checked against EC2's catalogue before a launch, against moto made faithful
on it: the front refuses a type its zone does not offer as EC2 does; a create goes only to zones
offering its type, refuses one no zone offers (Permanent, naming the field and where it runs)
without launching, keeps the catalogue an hour, and reads it again when EC2 refuses a launch."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from events.schemas import Placement
from services.providers.aws.provider import AwsProvider
from services.providers.base import Permanent, Transient
from services.providers.cloud.pure.spread import spread
from services.testing.aws import FaultFront, MotoEc2
from tests.contract.provider import owned
from tests.support.aws_support import *  # noqa: F403  # pytest finds fixtures by name here
from tests.support.aws_support import PROVIDER, REGION, config, described, request

pytestmark = pytest.mark.integration

TWO = ["eu-west-1a", "eu-west-1b"]
OFFERINGS = "DescribeInstanceTypeOfferings"


def subnet_in(ec2: Any, zone: str) -> str:
    subnets = ec2.describe_subnets(Filters=[{"Name": "availability-zone", "Values": [zone]}])
    return str(subnets["Subnets"][0]["SubnetId"])


def offered(ec2: Any, kind: str, instance_type: str) -> set[str]:
    answer = ec2.describe_instance_type_offerings(
        LocationType=kind, Filters=[{"Name": "instance-type", "Values": [instance_type]}]
    )
    return {o["Location"] for o in answer["InstanceTypeOfferings"]}


def refusal(call: Any) -> tuple[str, str]:
    with pytest.raises(ClientError) as refused:
        call()
    error = refused.value.response["Error"]
    return error["Code"], error["Message"]


def named_into(zone: str, zones: list[str], prefix: str) -> str:
    """An instance name the stable spread places in ``zone`` of ``zones``."""
    return next(n for i in range(100) if spread(zones, n := f"{prefix}{i}") == zone)


def test_the_front_answers_and_refuses_as_ec2_does(moto: MotoEc2, ec2: Any, image: str) -> None:
    moto.offer(REGION, "t3.nano", ["eu-west-1b"])
    assert offered(ec2, "availability-zone", "t3.nano") == {"eu-west-1b"}
    assert offered(ec2, "region", "t3.nano") == {REGION}

    def launch(kind: str, zone: str, **more: Any) -> Any:
        return lambda: ec2.run_instances(
            ImageId=image,
            InstanceType=kind,
            MinCount=1,
            MaxCount=1,
            SubnetId=subnet_in(ec2, zone),
            **more,
        )

    assert refusal(launch("t3.nano", "eu-west-1a")) == (
        "Unsupported",
        "Your requested instance type (t3.nano) is not supported in your requested Availability "
        "Zone (eu-west-1a). Please retry your request by not specifying an Availability Zone "
        "or choosing eu-west-1b.",
    )
    # A dry run answers for the permission only, as EC2's reference says.
    assert refusal(launch("t3.nano", "eu-west-1a", DryRun=True))[0] == "DryRunOperation"
    assert launch("t3.nano", "eu-west-1b")()["Instances"][0]["Placement"]["AvailabilityZone"] == (
        "eu-west-1b"
    )
    moto.offer(REGION, "t3.nano", [])
    assert offered(ec2, "region", "t3.nano") == set()
    assert refusal(launch("t3.nano", "eu-west-1b"))[0] == "Unsupported"
    assert refusal(launch("t3.nanoo", "eu-west-1b")) == (
        "InvalidParameterValue",
        "Invalid value 't3.nanoo' for InstanceType.",
    )
    moto.reset()
    assert offered(ec2, "availability-zone", "t3.nano") == {
        "eu-west-1a",
        "eu-west-1b",
        "eu-west-1c",
    }


async def test_instances_go_only_to_the_zones_offering_their_type(
    moto: MotoEc2, front: FaultFront, ec2: Any, image: str
) -> None:
    moto.offer(REGION, "t3.nano", ["eu-west-1b", "eu-west-1c"])
    names = [f"px-o{n}" for n in range(6)]
    assert any(spread(TWO, n) == "eu-west-1a" for n in names)  # some would go to 1a
    listed = AwsProvider(PROVIDER, config(front.url, image, zones=TWO))
    unlisted = AwsProvider(PROVIDER, config(front.url, image))
    async with owned(listed), owned(unlisted):
        placed = {
            described(ec2, await listed.create(request(n)))["Placement"]["AvailabilityZone"]
            for n in names
        }
        assert placed == {"eu-west-1b"}
        assert front.count(OFFERINGS) == 1  # kept: one call for six creates
        anywhere = [await unlisted.create(request(f"px-u{n}")) for n in range(6)]
        zones = {described(ec2, pid)["Placement"]["AvailabilityZone"] for pid in anywhere}
        assert zones <= {"eu-west-1b", "eu-west-1c"}


async def test_a_type_no_zone_offers_is_refused_before_launching(
    moto: MotoEc2, front: FaultFront, aws: AwsProvider
) -> None:
    moto.offer(REGION, "t3.nano", [])
    moto.offer("eu-central-1", "t3.nano", ["eu-central-1b"])
    with pytest.raises(Permanent) as refused:
        await aws.create(request("px-none"))
    message = str(refused.value)
    assert (
        "instanceType t3.nano is not offered in eu-west-1a, eu-west-1b, eu-west-1c of eu-west-1; "
        "no zone of eu-west-1 offers it: choose another type, or an entry for another region; "
        "regions offering t3.nano: "
    ) in message
    regions = message.split("regions offering t3.nano: ")[1].split(" (", maxsplit=1)[0].split(", ")
    assert "eu-central-1" in regions
    assert REGION not in regions
    moto.offer(REGION, "t3.micro", ["eu-west-1c"])
    wanted = Placement(zone="eu-west-1a", machine_type="t3.micro")
    with pytest.raises(
        Permanent,
        match=r"spec\.placement\.zone eu-west-1a: spec\.placement\.machineType t3\.micro is not "
        r"offered in that zone; it is offered in eu-west-1c",
    ):
        await aws.create(request("px-wanted", placement=wanted))
    assert "RunInstances" not in front.actions


async def test_the_catalogue_is_kept_an_hour_and_read_again_when_a_launch_is_refused(
    moto: MotoEc2, front: FaultFront, ec2: Any, image: str
) -> None:
    provider = AwsProvider(PROVIDER, config(front.url, image, zones=TWO))
    now = [0.0]
    provider.catalogue.clock = lambda: now[0]
    into_a = named_into("eu-west-1a", TWO, "px-k")
    async with owned(provider):
        await provider.create(request("px-k-first"))
        now[0] = 3599.0
        await provider.create(request("px-k-second"))
        assert front.count(OFFERINGS) == 1
        now[0] = 3600.0
        await provider.create(request("px-k-third"))
        assert front.count(OFFERINGS) == 2
        moto.offer(REGION, "t3.nano", ["eu-west-1b"])  # EC2 changed after it was read
        with pytest.raises(
            Transient, match=r"Unsupported.*\(instanceType t3\.nano in eu-west-1a\)"
        ):
            await provider.create(request(into_a))
        assert front.count(OFFERINGS) == 3  # read again at once
        pid = await provider.create(request(into_a))  # the executor's next try
        assert described(ec2, pid)["Placement"]["AvailabilityZone"] == "eu-west-1b"


async def test_a_launch_refused_where_the_catalogue_offers_the_type_is_permanent(
    front: FaultFront, aws: AwsProvider
) -> None:
    front.inject(
        "RunInstances",
        "Unsupported",
        message="The requested configuration is currently not supported.",
    )
    with pytest.raises(Permanent, match=r"\(instanceType t3\.nano in eu-west-1[abc]\); "):
        await aws.create(request("px-contradicted"))


async def test_credentials_without_the_catalogue_permission_launch_unchecked(
    front: FaultFront, ec2: Any, aws: AwsProvider
) -> None:
    front.deny(OFFERINGS)
    pid = await aws.create(request("px-unchecked"))
    assert described(ec2, pid)["InstanceType"] == "t3.nano"
    assert front.count(OFFERINGS) == 1
