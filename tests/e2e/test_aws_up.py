"""An aws proxy through `egress-proxies up`, against moto's EC2 emulator as a process of its own.

The emulator hands every instance 127.0.0.1 as its public address
(``services.testing.aws_moto`` says why) and the entry's ``proxyPort`` is the port of a
local Squid standing in for the VM, so the health probe reaches a real Squid through the address
the provider reports. The Proxy goes Ready; its instance terminated behind the system's back is
replaced and the Proxy is Ready again; deleted, its instance is terminated and GC deletes the
entry's security group. The secret parts of the
credentials `up` was given appear nowhere in its output or in any event stream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.providers.cloud.pure.firewall import firewall_name
from services.testing.aws import MotoEc2
from tests.support.aws_support import (
    REGION,
    SECRET,
    SESSION_TOKEN,
    admin,
    credentials_env,
    groups_named,
    ingress,
    moto_image,
)
from tests.support.cloud_up import ALLOWED, Cloud, CloudUp, cloud_up, parsed
from tests.support.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ENTRY = "aws-e2e"


def live_instances(ec2: Any) -> list[str]:
    reservations = ec2.describe_instances(
        Filters=[
            {"Name": "tag:egress-proxies/provider", "Values": [ENTRY]},
            {
                "Name": "instance-state-name",
                "Values": ["pending", "running", "stopping", "stopped"],
            },
        ]
    )["Reservations"]
    return [i["InstanceId"] for r in reservations for i in r["Instances"]]


async def test_an_aws_proxy_is_made_replaced_deleted_and_its_firewall_collected(
    tmp_path: Path,
) -> None:
    with MotoEc2(public_ips=["127.0.0.1"]) as moto:
        ec2 = admin(moto.url)
        settings = {"region": REGION, "image": moto_image(ec2), "timeoutSeconds": 10}
        cloud = Cloud("aws", ENTRY, settings, credentials_env(), (SECRET, SESSION_TOKEN))
        attributes = {"country": "ie", "cloud": "aws"}
        async with cloud_up(
            tmp_path, cloud, moto.url, proxy="ec2-1", attributes=attributes, gc_interval="2s"
        ) as run:
            await _lifecycle(run, ec2)

    run.assert_credentials_hidden()
    assert any(e["type"] == "OrphanDeleted" for e in parsed(run.streams["gc"].stdout))


async def _lifecycle(run: CloudUp, ec2: Any) -> None:
    await run.apply()
    await until(run.ready, timeout=60.0, what="the proxy Ready on its EC2 instance")
    (first,) = live_instances(ec2)
    (group,) = groups_named(ec2, firewall_name(ENTRY))
    port = run.squid.port
    assert ingress(group) == {("tcp", port, port, ALLOWED)}

    ec2.terminate_instances(InstanceIds=[first])  # behind the system's back

    async def replaced() -> bool:
        return live_instances(ec2) not in ([], [first]) and await run.ready()

    await until(replaced, timeout=60.0, what="a new instance, and the proxy Ready again")
    (second,) = live_instances(ec2)
    assert second != first
    created = [
        e["event"].get("provider_id") or e["event"].get("providerId")
        for e in await run.events("proxy")
        if e["type"] == "InstanceCreated"
    ]
    assert created[-2:] == [first, second]

    await run.delete()
    assert live_instances(ec2) == []

    await until(
        lambda: groups_named(ec2, firewall_name(ENTRY)) == [],
        timeout=60.0,
        what="GC deleting the security group",
    )
