"""The aws entry checked against EC2 without creating anything (``services/providers/preflight.py``;
docs/decisions/0143-aws-checks-its-catalogue-before-a-launch.md).

In order: the credentials and the region (DescribeRegions, which any valid credentials may call
unless a policy forbids it: an ``AuthFailure`` is the credentials, an ``UnauthorizedOperation``
only that permission); the VPC and subnets a create would use; the image (DescribeImages, and
DescribeInstanceTypes for its architecture); the instance type in each zone (the catalogue a
create reads); the security group's rules as a create would set them; and every call a create
and the GC make that EC2 can answer without acting, asked with ``DryRun=True``:
``DryRunOperation`` means allowed, ``UnauthorizedOperation`` not. EC2 tells no instance quota:
the vCPU quotas live in Service Quotas, which this does not read, and the finding says so.

Credentials are checked through EC2, not STS's GetCallerIdentity: ``endpointUrl`` names EC2's
endpoint only, and an STS call would go to another host than the one the config names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.providers.aws.client import CREDENTIALS_HOW, Ec2, error_code
from services.providers.aws.config import AMI
from services.providers.aws.firewall import DESCRIPTION
from services.providers.aws.pure import catalogue, mapping, network
from services.providers.aws.pure.launch import Launch
from services.providers.base import ProviderError, Transient
from services.providers.cloud.pure.settings import client_networks
from services.providers.preflight import Finding

if TYPE_CHECKING:
    from services.providers.aws.provider import AwsProvider

OP = "preflight"
IAM = "docs/providers.md, aws, Credentials and IAM"
AUTH_CODES = frozenset(
    {"AuthFailure", "SignatureDoesNotMatch", "InvalidClientTokenId", "UnrecognizedClientException"}
)
PREFLIGHT_NAME = "egress-proxies-preflight"
"""The instance name the dry run's tags carry: nothing is made under it."""


async def check_entry(provider: AwsProvider) -> list[Finding]:
    findings = await _credentials(provider.ec2)
    if not all(f.ok for f in findings if f.check in ("credentials", "region")):
        return findings
    found = await _network(provider, findings)
    await _image(provider.ec2, findings)
    subnets = await _sizes(provider, found[1] if found else [], findings)
    group = await _firewall(provider, found[0] if found else "", findings)
    if found:
        await _permissions(provider, found[0], subnets, group, findings)
    findings.append(
        Finding(
            "quota",
            True,
            "not read: EC2 tells no instance quota (DescribeAccountAttributes' max-instances "
            "no longer reflects it); the vCPU quotas are in Service Quotas (Running On-Demand "
            "Standard instances L-1216C47A, spot L-34B43A08), which this check does not call. "
            "A launch over them is QuotaExceeded, retried slowly",
        )
    )
    return findings


def refusal(check: str, exc: ProviderError, permission: str) -> Finding:
    """A failed call as a finding, its fix chosen by what EC2 said."""
    code = error_code(exc.__cause__ or exc)
    if code == "UnauthorizedOperation":
        fix = f"allow {permission} to these credentials ({IAM})"
    elif code in AUTH_CODES or "no usable AWS credentials" in str(exc):
        fix = CREDENTIALS_HOW
    elif isinstance(exc, Transient):
        fix = "check that this machine reaches EC2 (endpointUrl, a proxy, a firewall) and retry"
    else:
        fix = "see the detail: it is EC2's answer"
    return Finding(check, False, str(exc), fix)


async def _credentials(ec2: Ec2) -> list[Finding]:
    region = ec2.config.region
    try:
        answer = await ec2.call(
            OP,
            f"{ec2.provider_name}: describe region {region}",
            "describe_regions",
            RegionNames=[region],
            AllRegions=True,
        )
    except ProviderError as exc:
        if error_code(exc.__cause__ or exc) == "UnauthorizedOperation":
            return [  # authenticated: only this call is not allowed
                Finding("credentials", True, "EC2 knows them (it refused DescribeRegions only)"),
                refusal("permission ec2:DescribeRegions", exc, "ec2:DescribeRegions"),
            ]
        return [refusal("credentials", exc, "ec2:DescribeRegions")]
    regions = answer.get("Regions") or [{}]
    status = str(regions[0].get("OptInStatus") or "")
    disabled = status == "not-opted-in"
    fix = f"enable {region} for the account (account settings, Regions), or choose another"
    return [
        Finding("credentials", True, f"EC2 in {region} answered as these credentials"),
        Finding(
            "region", not disabled, f"{region}: {status or 'no opt-in status'}", fix * disabled
        ),
    ]


async def _network(
    provider: AwsProvider, findings: list[Finding]
) -> tuple[str, list[network.Subnet]] | None:
    try:
        vpc_id, subnets = await provider.vpc()
    except ProviderError as exc:
        findings.append(refusal("network", exc, "ec2:DescribeVpcs and ec2:DescribeSubnets"))
        return None
    zones = sorted({s.zone for s in subnets})
    findings.append(
        Finding(
            "network",
            bool(subnets),
            f"VPC {vpc_id}, {len(subnets)} subnet(s) in {', '.join(zones) or 'no zone'}",
            "" if subnets else "set subnets (or vpcId) in the config: the VPC has none to use",
        )
    )
    return vpc_id, subnets


async def _image(ec2: Ec2, findings: list[Finding]) -> None:
    config = ec2.config
    image, instance_type = config.image, config.instance_type
    if not AMI.match(image):
        findings.append(
            Finding(
                "image",
                True,
                f"{image}: an SSM parameter EC2 resolves at each launch (the caller needs "
                "ssm:GetParameters); not resolved here",
            )
        )
        return
    what = f"{ec2.provider_name}: describe image {image}"
    try:
        answer = await ec2.call(OP, what, "describe_images", ImageIds=[image])
    except ProviderError as exc:
        findings.append(refusal("image", exc, "ec2:DescribeImages"))
        return
    images = answer.get("Images") or []
    if not images or images[0].get("State") not in (None, "available"):
        state = images[0].get("State") if images else "not found"
        findings.append(
            Finding(
                "image",
                False,
                f"{image} in {config.region}: {state}",
                f"use an AMI of {config.region} (AMI ids differ per region), or a "
                "resolve:ssm: parameter",
            )
        )
        return
    arch = str(images[0].get("Architecture") or "")
    runs = await _architectures(ec2, instance_type)
    ok = not (arch and runs) or arch in runs
    findings.append(
        Finding(
            "image",
            ok,
            f"{image} ({images[0].get('Name') or 'no name'}, {arch or 'architecture unknown'})"
            + ("" if ok else f": {instance_type} runs {', '.join(runs)} only"),
            "" if ok else f"choose an image for {', '.join(runs)}, or a type running {arch}",
        )
    )


async def _architectures(ec2: Ec2, instance_type: str) -> list[str]:
    """What ``instance_type`` runs (empty when EC2 does not say)."""
    what = f"{ec2.provider_name}: describe instance type {instance_type}"
    try:
        answer = await ec2.call(OP, what, "describe_instance_types", InstanceTypes=[instance_type])
    except ProviderError:
        return []  # an unknown type: the size findings say so
    kinds = answer.get("InstanceTypes") or [{}]
    return [
        str(a) for a in (kinds[0].get("ProcessorInfo") or {}).get("SupportedArchitectures") or ()
    ]


async def _sizes(
    provider: AwsProvider, subnets: list[network.Subnet], findings: list[Finding]
) -> list[network.Subnet]:
    """A finding per zone a create would use; the subnets whose zone offers the type."""
    config = provider.config
    instance_type = config.instance_type
    try:
        offered = await provider.catalogue.zones(instance_type, op=OP)
    except ProviderError as exc:
        findings.append(refusal("size", exc, "ec2:DescribeInstanceTypeOfferings"))
        return subnets
    listed = bool(config.zones)
    zones = config.zones or tuple(sorted({s.zone for s in subnets}))
    if not zones:  # the network is unknown: what the region offers, at least
        where = ", ".join(sorted(offered)) or f"no zone of {config.region}"
        fix = "" if offered else "choose an instanceType this region offers"
        findings.append(Finding("size", bool(offered), f"{instance_type} offered in: {where}", fix))
        return subnets
    more = ""
    if not offered:
        regions = await provider.catalogue.regions(instance_type)
        more = f"; {catalogue.elsewhere(regions, instance_type)}"
    anywhere = any(z in offered for z in zones)
    for zone in zones:
        if zone in offered:
            findings.append(Finding(f"size in {zone}", True, f"{instance_type} is offered"))
            continue
        where = ", ".join(sorted(offered)) or f"no zone of {config.region}"
        detail = f"{instance_type} is not offered in {zone} (offered in: {where}){more}"
        if anywhere and not listed:
            findings.append(Finding(f"size in {zone}", True, f"{detail}: launches skip it"))
        elif anywhere:
            fix = f"remove {zone} from zones, or choose an instanceType it offers"
            findings.append(Finding(f"size in {zone}", False, detail, fix))
        else:
            fix = "choose an instanceType offered here, or an entry for a region offering it"
            findings.append(Finding(f"size in {zone}", False, detail, fix))
    return [s for s in subnets if s.zone in offered]


async def _firewall(
    provider: AwsProvider, vpc_id: str, findings: list[Finding]
) -> dict[str, Any] | None:
    """The rules a create would write, as a finding; the group when it exists."""
    firewall, config = provider.firewall, provider.config
    wanted = network.permissions_for(
        network.desired_rules(config.proxy_port, client_networks(config))
    )
    if not vpc_id:
        return None
    try:
        group = await firewall.find(vpc_id)
    except ProviderError as exc:
        findings.append(refusal("firewall", exc, "ec2:DescribeSecurityGroups"))
        return None
    if group is None:
        detail = (
            f"would make security group {firewall.name} in {vpc_id}, inbound exactly "
            f"{network.rules_text(wanted)}; outbound AWS's default (all)"
        )
    else:
        permissions = group.get("IpPermissions") or []
        assert isinstance(permissions, list)
        changes = network.rule_changes(permissions, config.proxy_port, client_networks(config))
        detail = f"security group {group.get('GroupId')}: " + (
            f"would add {network.rules_text(changes.authorize) or 'nothing'}, remove "
            f"{network.rules_text(changes.revoke) or 'nothing'}"
            if changes
            else f"inbound already exactly {network.rules_text(wanted)}"
        )
    findings.append(Finding("firewall", True, detail))
    return dict(group) if group is not None else None


async def _permissions(
    provider: AwsProvider,
    vpc_id: str,
    subnets: list[network.Subnet],
    group: dict[str, Any] | None,
    findings: list[Finding],
) -> None:
    ec2, config = provider.ec2, provider.config
    if subnets:
        launch = Launch(
            zone="",
            instance_type=config.instance_type,
            type_field="instanceType",
            image=config.image,
            tags=mapping.instance_tags(PREFLIGHT_NAME, PREFLIGHT_NAME, provider.name, ""),
            user_data=b"#!/bin/sh\n",
        )
        group_id = str(group.get("GroupId") or "") if group else ""
        params = launch.params(subnets[0], group_id, config)
        findings.append(await dry_run(ec2, "RunInstances", "run_instances", **params))
    name = provider.firewall.name
    findings.append(
        await dry_run(
            ec2,
            "CreateSecurityGroup",
            "create_security_group",
            GroupName=name,
            Description=DESCRIPTION,
            VpcId=vpc_id,
        )
    )
    if group is None:
        findings.append(
            Finding(
                "permission ec2:Authorize/RevokeSecurityGroupIngress",
                True,
                "asked once the group exists (EC2 needs a group to answer about); the first "
                "create makes it",
            )
        )
        return
    group_id = str(group.get("GroupId") or "")
    rules = network.permissions_for(
        network.desired_rules(config.proxy_port, client_networks(config))
    )
    for action, method in (
        ("AuthorizeSecurityGroupIngress", "authorize_security_group_ingress"),
        ("RevokeSecurityGroupIngress", "revoke_security_group_ingress"),
    ):
        findings.append(await dry_run(ec2, action, method, GroupId=group_id, IpPermissions=rules))
    findings.append(
        await dry_run(ec2, "DeleteSecurityGroup", "delete_security_group", GroupId=group_id)
    )


async def dry_run(ec2: Ec2, action: str, method: str, **params: Any) -> Finding:
    """``action`` asked with ``DryRun=True``: EC2 answers whether these credentials may."""
    check = f"permission ec2:{action}"
    try:
        await ec2.call(
            OP, f"{ec2.provider_name}: dry run of {action}", method, DryRun=True, **params
        )
    except ProviderError as exc:
        if error_code(exc.__cause__ or exc) == "DryRunOperation":
            return Finding(check, True, "allowed (EC2 answered DryRunOperation)")
        return refusal(check, exc, f"ec2:{action}")
    return Finding(
        check,
        False,
        f"the endpoint ran {action} instead of answering DryRunOperation",
        "point endpointUrl at EC2 (or leave it out)",
    )
