"""The ``aws:`` block of a providers-config entry, validated when the file is read.

``zones``, ``instanceType`` and ``image`` are defaults for a Proxy's ``spec.placement``: a Proxy
that names them wins, one that does not gets these. Every check names the field and the fix, so a
typo stops start-up instead of failing every create much later. Credentials are not settings: the
AWS default chain finds them (docs/providers.md, "aws").
"""

from __future__ import annotations

import re

from services.providers.cloud.pure.settings import (
    CloudSettings,
    check_cloud_settings,
    places_problem,
    shown,
)

DEFAULT_IMAGE = "resolve:ssm:/aws/service/debian/release/12/latest/amd64"
"""Debian 12's current AMI in the region, through the public SSM parameter EC2 resolves at
launch: no AMI id to keep up to date per region."""
DEFAULT_INSTANCE_TYPE = "t3.nano"
"""The cheapest x86 type of the current generation: Squid for one crawler's traffic needs
little more than its 512 MiB."""
MAX_ZONES = 32
MAX_SUBNETS = 64

REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}\Z")
ZONE_SUFFIX = re.compile(r"^([a-z]|-[a-z0-9-]{0,40}[a-z])\Z")
SUBNET = re.compile(r"^subnet-[0-9a-f]{8,17}\Z")
VPC = re.compile(r"^vpc-[0-9a-f]{8,17}\Z")
INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]{0,30}\.[a-z0-9-]{1,30}\Z")
AMI = re.compile(r"^ami-[0-9a-f]{8,17}\Z")
SSM_IMAGE = re.compile(r"^resolve:ssm:[A-Za-z0-9/_.:-]{1,2000}\Z")
PROFILE = re.compile(r"^[A-Za-z0-9_.+@=,-]{1,128}\Z")
KEY_NAME = re.compile(r"^[\x20-\x7e]{1,255}\Z")


class AwsConfig(
    CloudSettings, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """Settings of one named aws provider; see docs/providers.md for each field."""

    region: str = ""
    zones: tuple[str, ...] = ()
    """Zones the instances are spread over (by a stable hash of their name); empty: every zone
    that has a subnet to use."""
    subnets: tuple[str, ...] = ()
    """Subnet ids to launch into (one or more per zone); empty: the VPC's default subnets."""
    instance_type: str = DEFAULT_INSTANCE_TYPE
    image: str = DEFAULT_IMAGE
    vpc_id: str = ""
    """Empty: the region's default VPC (or the VPC of ``subnets``)."""
    profile: str = ""
    """A named profile of the shared AWS config files; empty: the default credential chain."""
    spot: bool = False
    key_name: str = ""

    def __post_init__(self) -> None:
        problem = check_cloud_settings(self) or validate(self)
        if problem:
            raise ValueError(problem)


def image_problem(image: str, field: str) -> str:
    if AMI.match(image) or SSM_IMAGE.match(image):
        return ""
    return (
        f"{field} {shown(image)}: use an AMI id (ami-0123456789abcdef0) or an SSM parameter "
        f"(resolve:ssm:/aws/service/debian/release/12/latest/amd64)"
    )


def instance_type_problem(instance_type: str, field: str) -> str:
    if INSTANCE_TYPE.match(instance_type):
        return ""
    return (
        f"{field} {shown(instance_type)}: use an EC2 instance type such as {DEFAULT_INSTANCE_TYPE}"
    )


def zone_problem(zone: str, region: str, field: str) -> str:
    if zone.startswith(region) and ZONE_SUFFIX.match(zone[len(region) :]):
        return ""
    return (
        f"{field} {shown(zone)}: use an availability zone of region {region}, such as {region}a "
        f"(or its zone id's name, e.g. {region}-lax-1a for a Local Zone)"
    )


def validate(config: AwsConfig) -> str:
    """The first problem with the aws fields, or ``""``; a message names the field and the fix."""
    if not config.region:
        return "region is required: the AWS region the instances run in, e.g. eu-west-1"
    if not REGION.match(config.region):
        return f"region {shown(config.region)}: use a region code such as eu-west-1 or us-east-2"
    return (
        places_problem("zones", config.zones, MAX_ZONES, noun="a zone")
        or next((p for z in config.zones if (p := zone_problem(z, config.region, "zones:"))), "")
        or places_problem(
            "subnets",
            config.subnets,
            MAX_SUBNETS,
            noun="a subnet",
            pattern=SUBNET,
            what="a subnet id; use e.g. subnet-0123456789abcdef0",
        )
        or instance_type_problem(config.instance_type, "instanceType")
        or image_problem(config.image, "image")
        or _optional_problem(config)
    )


def _optional_problem(config: AwsConfig) -> str:
    if config.vpc_id and not VPC.match(config.vpc_id):
        return (
            f"vpcId {shown(config.vpc_id)} is not a VPC id; use e.g. vpc-0123456789abcdef0, "
            "or leave it out for the default VPC"
        )
    if config.profile and not PROFILE.match(config.profile):
        return (
            f"profile {shown(config.profile)}: use the name of a profile in ~/.aws/config "
            "(letters, digits and _.+@=,-), or leave it out for the default credential chain"
        )
    if config.key_name and not KEY_NAME.match(config.key_name):
        return (
            f"keyName {shown(config.key_name)}: use the name of an EC2 key pair (at most 255 "
            "printable ASCII characters), or leave it out"
        )
    return ""
