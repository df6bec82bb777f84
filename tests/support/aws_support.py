"""Shared pieces of the aws provider tests: fake credentials (whose secret parts must appear
nowhere), a config pointing at moto or its fault front, requests with the fields the tests vary,
and an EC2 client of the test's own for what happens behind the system's back."""

from __future__ import annotations

import base64
import gzip
from collections.abc import AsyncIterator, Iterator
from typing import Any

# boto3 ships no type information; only these helpers use it.
import boto3  # type: ignore[import-untyped]
import msgspec
import pytest

from services.providers.aws.config import AwsConfig
from services.providers.aws.provider import AwsProvider
from services.providers.base import CreateRequest
from services.testing.aws import FaultFront, MotoEc2
from tests.contract.provider import owned
from tests.support.cloud_requests import cloud_request
from tests.support.markers import starts

__all__ = ["aws", "ec2", "front", "image", "moto"]
"""The fixtures, for ``from tests.support.aws_support import *`` in a test module."""

REGION = "eu-west-1"
ZONES = ("eu-west-1a", "eu-west-1b", "eu-west-1c")
ACCESS_KEY = "AKIAEGRESSTESTING042"
SECRET = "egress-aws-secret-Zq8xW2vN5pR7tY1uQ"
"""The secret access key: a test fails if it shows in a log line, an error or an event."""
SESSION_TOKEN = "egress-aws-session-Kc4jH6gF9dS3mL0"
"""Sent in a header on every request (botocore's debug log would print it)."""
PROVIDER = "aws-eu"


def credentials_env() -> dict[str, str]:
    """The default chain finds these in the environment and nothing else: no shared files, no
    instance metadata service (which a test must never ask)."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": SESSION_TOKEN,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/nonexistent/aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
    }


UNSET = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")


def config(endpoint: str, image: str, **overrides: Any) -> AwsConfig:
    settings: dict[str, Any] = {
        "region": REGION,
        "allowedClients": ["127.0.0.0/8", "::1/128"],
        "endpointUrl": endpoint,
        "image": image,
        "timeoutSeconds": 10,
    }
    settings.update(overrides)
    return msgspec.convert(settings, AwsConfig)


def request(name: str, **fields: Any) -> CreateRequest:
    return cloud_request(PROVIDER, name, **fields)


def admin(endpoint: str) -> Any:
    """An EC2 client of the test's own: someone else acting on the account."""
    return boto3.client(
        "ec2",
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id="admin",
        aws_secret_access_key="admin-secret",
    )


def moto_image(client: Any) -> str:
    """An AMI moto knows (its validation refuses any other)."""
    return str(client.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])


def described(client: Any, instance_id: str) -> dict[str, Any]:
    reservations = client.describe_instances(InstanceIds=[instance_id])["Reservations"]
    found: dict[str, Any] = reservations[0]["Instances"][0]
    return found


def user_data(client: Any, instance_id: str) -> str:
    answer = client.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    raw = base64.b64decode(answer["UserData"]["Value"])
    # User data over EC2's limit is sent gzip-compressed; cloud-init reads both.
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()


def groups_named(client: Any, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = client.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [name]}]
    )["SecurityGroups"]
    return found


def ingress(group: dict[str, Any]) -> set[tuple[str, int, int, str]]:
    """A group's ingress as (protocol, from, to, CIDR) rules."""
    rules = set()
    for perm in group["IpPermissions"]:
        key = (perm["IpProtocol"], perm.get("FromPort", -1), perm.get("ToPort", -1))
        rules |= {(*key, r["CidrIp"]) for r in perm.get("IpRanges", [])}
        rules |= {(*key, r["CidrIpv6"]) for r in perm.get("Ipv6Ranges", [])}
    return rules


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
@starts("moto's EC2 server")
def moto() -> Iterator[MotoEc2]:
    """One emulator process per test module; ``ec2`` resets it for every test."""
    with MotoEc2() as server:
        yield server


@pytest.fixture(autouse=True)
def ec2(moto: MotoEc2, monkeypatch: pytest.MonkeyPatch) -> Any:
    """For every test, a fresh account (moto reset) seen by the default chain through fake
    credentials; the client returned is the test's own, acting behind the provider's back."""
    moto.reset()
    for name in UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in credentials_env().items():
        monkeypatch.setenv(name, value)
    return admin(moto.url)


@pytest.fixture(scope="module")
def image(moto: MotoEc2) -> str:
    """moto's AMIs are the same after a reset: looked up once (the listing is a megabyte)."""
    return moto_image(admin(moto.url))


@pytest.fixture
def front(moto: MotoEc2) -> Iterator[FaultFront]:
    with FaultFront(moto.url) as server:
        yield server


@pytest.fixture
async def aws(front: FaultFront, image: str) -> AsyncIterator[AwsProvider]:
    """The provider under test, through the front; what a test left is terminated after."""
    async with owned(AwsProvider(PROVIDER, config(front.url, image))) as provider:
        yield provider
