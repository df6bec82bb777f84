"""The aws preflight against moto and its front, made faithful where moto is not (a type taken
from a zone, a permission refused): a good entry passes every check and creates nothing, and each
kind of bad one fails the check it concerns with its fix."""

from __future__ import annotations

from typing import Any

import pytest

from services.providers.aws.provider import AwsProvider
from services.providers.preflight import Finding, Preflight, failed, run_preflight
from services.testing.aws import FaultFront, MotoEc2
from tests.support.aws_support import *  # noqa: F403  # pytest finds fixtures by name here
from tests.support.aws_support import PROVIDER, REGION, config, groups_named, request

pytestmark = pytest.mark.integration

GROUP = "egress-proxies-aws-eu"


async def preflight(front: FaultFront, image: str, **overrides: Any) -> dict[str, Finding]:
    provider = AwsProvider(PROVIDER, config(front.url, image, **overrides))
    try:
        assert isinstance(provider, Preflight)
        findings = await run_preflight(provider)
    finally:
        await provider.close()
    by_check = {f.check: f for f in findings}
    assert len(by_check) == len(findings), findings
    return by_check


def arm_image(ec2: Any) -> str:
    images = ec2.describe_images(
        Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["arm64"]}]
    )["Images"]
    return str(images[0]["ImageId"])


async def test_a_good_entry_passes_every_check_and_creates_nothing(
    front: FaultFront, ec2: Any, image: str
) -> None:
    found = await preflight(front, image, zones=["eu-west-1a", "eu-west-1b"])
    assert failed(list(found.values())) == []
    assert {
        "credentials",
        "region",
        "network",
        "image",
        "size in eu-west-1a",
        "size in eu-west-1b",
        "firewall",
        "permission ec2:RunInstances",
        "permission ec2:CreateSecurityGroup",
        "permission ec2:Authorize/RevokeSecurityGroupIngress",
        "quota",
    } == set(found)
    assert found["permission ec2:RunInstances"].detail == "allowed (EC2 answered DryRunOperation)"
    assert found["firewall"].detail.startswith(f"would make security group {GROUP} in vpc-")
    assert found["firewall"].detail.endswith(
        "inbound exactly tcp 3128 from 127.0.0.0/8, ::1/128; outbound AWS's default (all)"
    )
    assert "Service Quotas" in found["quota"].detail
    sent = [b for b in front.bodies if b["Action"] == ["RunInstances"]]
    assert [b["DryRun"] for b in sent] == [["true"]]
    assert (sent[0]["InstanceType"], sent[0]["ImageId"]) == (["t3.nano"], [image])
    assert [b.get("DryRun") for b in front.bodies if b["Action"] == ["CreateSecurityGroup"]] == [
        ["true"]
    ]
    assert ec2.describe_instances()["Reservations"] == []
    assert groups_named(ec2, GROUP) == []


async def test_with_the_group_made_its_rule_and_delete_permissions_are_asked_too(
    front: FaultFront, ec2: Any, image: str, aws: AwsProvider
) -> None:
    await aws.create(request("px-first"))
    (group,) = groups_named(ec2, GROUP)
    ec2.authorize_security_group_ingress(
        GroupId=group["GroupId"],
        IpPermissions=[
            {
                "IpProtocol": "tcp",
                "FromPort": 22,
                "ToPort": 22,
                "IpRanges": [{"CidrIp": "198.51.100.0/24"}],
            }
        ],
    )
    found = await preflight(front, image)
    assert failed(list(found.values())) == []
    assert found["firewall"].detail == (
        f"security group {group['GroupId']}: would add nothing, remove tcp 22 from 198.51.100.0/24"
    )
    for action in (
        "AuthorizeSecurityGroupIngress",
        "RevokeSecurityGroupIngress",
        "DeleteSecurityGroup",
    ):
        assert found[f"permission ec2:{action}"].ok
    assert {b["Action"][0] for b in front.bodies if b.get("DryRun") == ["true"]} >= {
        "RunInstances",
        "CreateSecurityGroup",
        "AuthorizeSecurityGroupIngress",
        "RevokeSecurityGroupIngress",
        "DeleteSecurityGroup",
    }
    assert len(groups_named(ec2, GROUP)) == 1  # the dry runs changed nothing
    assert {(p["FromPort"]) for p in groups_named(ec2, GROUP)[0]["IpPermissions"]} == {22, 3128}


async def test_refused_permissions_fail_their_check_with_the_policy_fix(
    front: FaultFront, image: str
) -> None:
    front.deny("RunInstances", "CreateSecurityGroup")
    found = await preflight(front, image)
    assert {f.check for f in failed(list(found.values()))} == {
        "permission ec2:RunInstances",
        "permission ec2:CreateSecurityGroup",
    }
    refused = found["permission ec2:RunInstances"]
    assert "UnauthorizedOperation (HTTP 403)" in refused.detail
    assert refused.fix.startswith("allow ec2:RunInstances to these credentials")
    assert found["credentials"].ok


async def test_credentials_ec2_refuses_or_none_at_all_stop_at_the_first_check(
    front: FaultFront, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    front.inject(
        "DescribeRegions",
        "AuthFailure",
        status=401,
        message="AWS was not able to validate the provided access credentials",
    )
    found = await preflight(front, image)
    assert list(found) == ["credentials"]
    assert "AuthFailure" in found["credentials"].detail
    assert "AWS_ACCESS_KEY_ID" in found["credentials"].fix
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    found = await preflight(front, image)
    assert list(found) == ["credentials"]
    assert "no usable AWS credentials" in found["credentials"].detail
    assert "AWS_ACCESS_KEY_ID" in found["credentials"].fix


async def test_an_unreachable_ec2_is_a_failed_check_saying_so(
    front: FaultFront, image: str
) -> None:
    front.inject("DescribeRegions", "InternalError", status=500)
    found = await preflight(front, image)
    assert not found["credentials"].ok
    assert "reaches EC2" in found["credentials"].fix


async def test_an_image_not_in_the_region_or_for_another_architecture_fails_the_image_check(
    front: FaultFront, ec2: Any, image: str
) -> None:
    found = await preflight(front, "ami-0123456789abcdef0")
    assert [f.check for f in failed(list(found.values()))] == ["image"]
    assert "InvalidAMIID.NotFound" in found["image"].detail
    found = await preflight(front, image, instanceType="t4g.nano")
    (bad,) = failed(list(found.values()))
    assert (bad.check, bad.detail.split(": ")[-1]) == ("image", "t4g.nano runs arm64 only")
    assert bad.fix == "choose an image for arm64, or a type running x86_64"
    found = await preflight(front, arm_image(ec2), instanceType="t4g.nano")
    assert failed(list(found.values())) == []
    found = await preflight(front, "resolve:ssm:/aws/service/debian/release/12/latest/amd64")
    assert found["image"].ok
    assert "not resolved here" in found["image"].detail


async def test_a_listed_zone_without_the_type_fails_and_an_unlisted_one_is_skipped(
    moto: MotoEc2, front: FaultFront, image: str
) -> None:
    moto.offer(REGION, "t3.nano", ["eu-west-1b", "eu-west-1c"])
    found = await preflight(front, image, zones=["eu-west-1a", "eu-west-1b"])
    (bad,) = failed(list(found.values()))
    assert bad.check == "size in eu-west-1a"
    assert bad.detail == "t3.nano is not offered in eu-west-1a (offered in: eu-west-1b, eu-west-1c)"
    assert bad.fix == "remove eu-west-1a from zones, or choose an instanceType it offers"
    found = await preflight(front, image)  # every zone with a default subnet
    assert failed(list(found.values())) == []
    assert found["size in eu-west-1a"].detail.endswith(": launches skip it")


async def test_a_type_no_zone_of_the_region_offers_fails_naming_the_regions_that_do(
    moto: MotoEc2, front: FaultFront, image: str
) -> None:
    moto.offer(REGION, "t3.nano", [])
    found = await preflight(front, image, zones=["eu-west-1a"])
    (bad,) = failed(list(found.values()))
    assert bad.check == "size in eu-west-1a"
    assert "offered in: no zone of eu-west-1" in bad.detail
    assert "regions offering t3.nano: " in bad.detail
    assert "eu-central-1" in bad.detail.split("regions offering t3.nano: ")[1]
    assert bad.fix.startswith("choose an instanceType offered here")
