"""The aws provider through the real aiobotocore client against moto's EC2 emulator (a process of
its own), with a front that answers what EC2 answers and moto never does (capacity, throttling,
5xx, stalls): the shared contract, the errors, what a listing and a repeated create read,
credentials that never show. What a launch sends is in test_aws_launch.py."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from events.schemas import InstanceState
from services.providers.aws.provider import AwsProvider
from services.providers.base import (
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from services.runtime.observability.logs import configure_logging, reset_logging
from services.testing.aws import FaultFront
from tests.contract.provider import (
    CarriesIdentity,
    MakeRequest,
    ProviderContract,
    Provoke,
    closing,
    delete_all,
    request_factory,
)
from tests.support.aws_support import *  # noqa: F403  # pytest finds fixtures by name here
from tests.support.aws_support import PROVIDER, SECRET, SESSION_TOKEN, config, request

pytestmark = pytest.mark.integration

UNKNOWN_ID = "i-0123456789abcdef0"


# ----------------------------------------------------------------------------- contract


class TestAwsContract(ProviderContract, CarriesIdentity):
    ready_timeout = 10.0

    @pytest.fixture
    async def provider(self, aws: AwsProvider) -> AwsProvider:
        return aws

    @pytest.fixture
    def make_request(self) -> MakeRequest:
        return request_factory(PROVIDER)

    @pytest.fixture
    async def provoke(
        self, aws: AwsProvider, front: FaultFront, make_request: MakeRequest
    ) -> AsyncIterator[Provoke]:
        bad_image = AwsProvider(PROVIDER, config(front.url, "ami-0000000000000dead"))
        slow = AwsProvider(PROVIDER, config(front.url, "ami-0000000000000dead", timeoutSeconds=0.3))

        async def fail(action: str, code: str, status: int, call: Any) -> object:
            front.inject(action, code, status=status, retry_after="2")
            result: object = await call()
            return result

        def launch() -> Any:
            return aws.create(make_request("e1"))

        def listing() -> Any:
            return aws.list_by_tag()

        def delete() -> Any:
            return aws.delete(UNKNOWN_ID)

        def get() -> Any:
            return aws.get(UNKNOWN_ID)

        async def stalled() -> object:
            front.stall("DescribeInstances", 1.0)
            return await slow.get(UNKNOWN_ID)

        yield [
            (
                "no capacity",
                lambda: fail("RunInstances", "InsufficientInstanceCapacity", 500, launch),
            ),
            ("throttled", lambda: fail("DescribeInstances", "RequestLimitExceeded", 503, listing)),
            ("an image EC2 does not have", lambda: bad_image.create(make_request("e2"))),
            ("a 5xx", lambda: fail("TerminateInstances", "InternalError", 500, delete)),
            ("forbidden", lambda: fail("DescribeInstances", "UnauthorizedOperation", 403, get)),
            ("a stalled answer", stalled),
        ]
        await bad_image.close()
        await slow.close()


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("InsufficientInstanceCapacity", 500, QuotaExceeded),
        ("VcpuLimitExceeded", 400, QuotaExceeded),
        ("InstanceLimitExceeded", 400, QuotaExceeded),
        ("MaxSpotInstanceCountExceeded", 400, QuotaExceeded),
        ("InsufficientFreeAddressesInSubnet", 400, QuotaExceeded),
        ("RequestLimitExceeded", 503, Transient),
        ("Throttling", 429, Transient),
        ("InternalError", 500, Transient),
        ("Unavailable", 503, Transient),
        ("SomethingNew", 502, Transient),
        ("InvalidParameterValue", 400, Permanent),
        ("InvalidParameterCombination", 400, Permanent),
        ("Unsupported", 400, Permanent),
        ("UnauthorizedOperation", 403, Permanent),
        ("AuthFailure", 401, Permanent),
        ("OptInRequired", 401, Permanent),
        ("InvalidKeyPair.NotFound", 400, Permanent),
        ("InvalidSubnetID.NotFound", 400, Permanent),
        ("InvalidAMIID.Malformed", 400, Permanent),
    ],
)
async def test_launch_errors_are_classified_once_without_client_retries(
    aws: AwsProvider,
    front: FaultFront,
    code: str,
    status: int,
    expected: type[ProviderError],
) -> None:
    front.inject("RunInstances", code, status=status, message=f"EC2 says {code}")
    with pytest.raises(ProviderError) as caught:
        await aws.create(request("px-a"))
    assert type(caught.value) is expected
    assert f"{code} (HTTP {status}): EC2 says {code}" in str(caught.value)
    assert isinstance(caught.value.__cause__, ClientError)  # the client's error, chained
    assert front.count("RunInstances") == 1  # the executor owns retrying, not botocore
    assert await aws.list_by_tag() == []


@pytest.mark.parametrize(
    ("header", "expected"),
    [("7", 7.0), ("0.5", 0.5), ("", 0.0), ("soon", 0.0), ("99999", 3600.0)],
)
async def test_a_throttling_answers_delay_reaches_the_error(
    aws: AwsProvider, front: FaultFront, ec2: Any, header: str, expected: float
) -> None:
    front.inject("DescribeInstances", "Throttling", status=429, retry_after=header)
    with pytest.raises(Transient) as caught:
        await aws.list_by_tag()
    assert caught.value.retry_after == expected


async def test_a_retry_after_date_is_seconds_from_now(
    aws: AwsProvider, front: FaultFront, ec2: Any
) -> None:
    when = datetime.now(UTC) + timedelta(seconds=120)
    front.inject(
        "RunInstances", "RequestLimitExceeded", status=503, retry_after=format_datetime(when, True)
    )
    with pytest.raises(Transient) as caught:
        await aws.create(request("px-date"))
    assert 60 < caught.value.retry_after <= 120


async def test_get_and_delete_of_ids_ec2_does_not_know(
    aws: AwsProvider, front: FaultFront, ec2: Any
) -> None:
    for bad in ("px-1", "i-XYZ", "", "i-0123/../x", "sg-0123456789abcdef0"):
        with pytest.raises(NotFound):
            await aws.get(bad)
        await aws.delete(bad)
    assert front.actions == []  # never asked: not an id EC2 issues
    with pytest.raises(NotFound, match=r"InvalidInstanceID\.NotFound"):
        await aws.get(UNKNOWN_ID)  # moto's own answer
    await aws.delete(UNKNOWN_ID)
    front.inject("DescribeInstances", "InvalidInstanceID.Malformed", status=400)
    with pytest.raises(NotFound):
        await aws.get(UNKNOWN_ID)


async def test_a_stalled_endpoint_is_a_bounded_transient_failure(
    front: FaultFront, image: str
) -> None:
    provider = AwsProvider(PROVIDER, config(front.url, image, timeoutSeconds=0.3))
    front.stall("DescribeInstances", 5.0)
    try:
        with pytest.raises(Transient, match=r"timed out|Timeout"):
            await provider.get(UNKNOWN_ID)
    finally:
        await provider.close()


async def test_an_unreachable_endpoint_is_transient(image: str, ec2: Any) -> None:
    with FaultFront("http://127.0.0.1:9") as gone:
        endpoint = gone.url
    async with closing(AwsProvider(PROVIDER, config(endpoint, image))) as provider:
        with pytest.raises(Transient):
            await provider.list_by_tag()


async def test_no_credentials_is_permanent_and_says_how_to_give_them(
    front: FaultFront, image: str, ec2: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    async with closing(AwsProvider(PROVIDER, config(front.url, image))) as provider:
        with pytest.raises(Permanent) as caught:
            await provider.list_by_tag()
    assert "no usable AWS credentials" in str(caught.value)
    assert "AWS_ACCESS_KEY_ID" in str(caught.value)
    assert front.actions == []  # nothing unsigned left the process
    async with closing(
        AwsProvider(PROVIDER, config(front.url, image, profile="crawl-prod"))
    ) as missing:
        with pytest.raises(Permanent, match="crawl-prod"):
            await missing.list_by_tag()


async def test_credentials_never_show_in_logs_or_errors(
    front: FaultFront, image: str, ec2: Any
) -> None:
    stream = io.StringIO()
    configure_logging(level="debug", fmt="json", stream=stream)
    provider = AwsProvider(PROVIDER, config(front.url, image))
    errors: list[str] = []
    try:
        pid = await provider.create(request("px-secret", cloud_init="#cloud-config\n"))
        await provider.get(pid)
        for code, status in [("AuthFailure", 401), ("SignatureDoesNotMatch", 403)]:
            front.inject("RunInstances", code, status=status)
            with pytest.raises(ProviderError) as caught:
                await provider.create(request(f"px-{status}"))
            errors.append(f"{caught.value!r} {caught.value} {caught.value.__cause__}")
        await provider.delete(pid)
        assert logging.getLogger("botocore").getEffectiveLevel() >= logging.INFO
    finally:
        await provider.close()
        reset_logging()
    text = stream.getvalue()
    assert "instance launch accepted" in text  # the capture works
    assert "ec2 client made" in text  # at debug, which was on
    for secret in (SECRET, SESSION_TOKEN):
        assert secret not in text
        assert not any(secret in error for error in errors)
    assert SECRET not in repr(provider)
    assert SECRET not in repr(provider.config)


# ----------------------------------------------------------------------------- what is read


async def test_listing_sees_only_this_named_entry(front: FaultFront, ec2: Any, image: str) -> None:
    eu = AwsProvider("aws-eu", config(front.url, image))
    us = AwsProvider("aws-us", config(front.url, image))
    try:
        eu_ids = {await eu.create(request(f"px-eu-{n}")) for n in range(3)}
        us_id = await us.create(request("px-us-0"))
        ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)  # someone else's
        assert {i.provider_id for i in await eu.list_by_tag()} == eu_ids
        assert [i.provider_id for i in await us.list_by_tag()] == [us_id]
        ec2.stop_instances(InstanceIds=[us_id])
        (stopped,) = await us.list_by_tag()
        assert stopped.state is InstanceState.STOPPED  # listed in every state but terminated
    finally:
        for provider in (eu, us):
            await delete_all(provider)
            await provider.close()


async def test_a_create_after_a_termination_behind_its_back_is_a_new_instance(
    aws: AwsProvider, ec2: Any
) -> None:
    first = await aws.create(request("px-again"))
    ec2.terminate_instances(InstanceIds=[first])
    second = await aws.create(request("px-again"))  # the same name, within the minute
    assert second != first
    assert (await aws.get(second)).state is InstanceState.RUNNING


async def test_concurrent_creates_of_many_names(aws: AwsProvider, ec2: Any) -> None:
    names = [f"px-many-{n % 5}" for n in range(20)]
    ids = await asyncio.gather(*(aws.create(request(name)) for name in names))
    by_name: dict[str, set[str]] = {}
    for name, pid in zip(names, ids, strict=True):
        by_name.setdefault(name, set()).add(pid)
    assert all(len(found) == 1 for found in by_name.values())
    assert len(await aws.list_by_tag()) == 5
    assert aws._names == {}  # the per-name locks are dropped once unused
