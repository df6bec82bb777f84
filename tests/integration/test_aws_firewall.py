"""The aws provider's security group and its garbage collection, against moto's EC2 emulator:
made once with exactly ``allowedClients`` on ``proxyPort`` and shared, a leftover only once no
instance is left, deleted by GC's real sweep (grace and dry run honoured) and made again by the
next create; and the user data a VM boots with."""

from __future__ import annotations

import base64
import email.parser
import email.policy
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from typing import Any

import pytest

from events import subjects
from events.schemas import OrphanDeleted, OrphanFound, SweepCompleted
from services.gc.collector import GarbageCollector
from services.gc.lock import SweepLock
from services.gc.pure.rules import EPOCH
from services.gc.sweep import sweep_once
from services.providers.aws.provider import AwsProvider
from services.providers.base import (
    CREATED_AT_LABEL,
    MANAGED_LABEL,
    OWNER_LABEL,
    Leftover,
    Permanent,
    Transient,
)
from services.providers.cloud.pure.firewall import FIREWALL_KIND, firewall_name, firewall_owner
from services.providers.cloud.pure.guard import PART_NAME as GUARD_PART
from services.providers.cloud.pure.userdata import PART_NAME as SQUID_PART
from services.providers.squidauth.keyed import lease_keyed
from services.providers.squidauth.pure.cloudinit import PART_NAME as LEASE_PART
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.observability.metrics import Metrics
from services.testing.aws import FaultFront
from tests.contract.provider import (
    closing,
    delete_all,
    owned,
)
from tests.support.aws_support import *  # noqa: F403  # pytest finds fixtures by name here
from tests.support.aws_support import (
    PROVIDER,
    config,
    described,
    groups_named,
    ingress,
    request,
    user_data,
)

pytestmark = pytest.mark.integration

GROUP = firewall_name(PROVIDER)
OWNER = firewall_owner(PROVIDER)


def mime_parts(text: str) -> dict[str, str]:
    """The parts of multipart user data by file name, decoded, in order."""
    message = email.parser.Parser(policy=email.policy.default).parsestr(text)
    return {
        str(part.get_filename()): str(part.get_content())
        for part in message.iter_parts()
        if isinstance(part, EmailMessage)
    }


def default_vpc(ec2: Any) -> str:
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    return str(vpcs[0]["VpcId"])


def hand_made_group(ec2: Any, name: str, tags: dict[str, str]) -> str:
    made = ec2.create_security_group(
        GroupName=name,
        Description="made by hand",
        VpcId=default_vpc(ec2),
        TagSpecifications=[
            {
                "ResourceType": "security-group",
                "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
            }
        ],
    )
    return str(made["GroupId"])


OUR_TAGS = {MANAGED_LABEL: "true", "egress-proxies/provider": PROVIDER}


# ----------------------------------------------------------------------------- the group


async def test_one_group_with_exactly_the_allowed_clients_shared_by_every_instance(
    front: FaultFront, ec2: Any, image: str
) -> None:
    clients = ["203.0.113.0/24", "198.51.100.7/32", "2001:db8::/48", "127.0.0.0/8"]
    provider = AwsProvider(
        PROVIDER, config(front.url, image, allowedClients=clients, proxyPort=8080)
    )
    again = AwsProvider(PROVIDER, config(front.url, image, allowedClients=clients, proxyPort=8080))
    try:
        first = await provider.create(request("px-g1"))
        second = await provider.create(request("px-g2"))
        third = await again.create(request("px-g3"))  # another process of the same entry
        (group,) = groups_named(ec2, GROUP)
        assert ingress(group) == {("tcp", 8080, 8080, cidr) for cidr in clients}
        assert front.count("CreateSecurityGroup") == 1
        tags = {t["Key"]: t["Value"] for t in group["Tags"]}
        assert tags[MANAGED_LABEL] == "true"
        assert tags[OWNER_LABEL] == OWNER
        assert tags["egress-proxies/provider"] == PROVIDER
        made = datetime.fromisoformat(tags[CREATED_AT_LABEL])
        assert timedelta(0) <= datetime.now(UTC) - made < timedelta(minutes=5)
        for pid in (first, second, third):
            (nic,) = described(ec2, pid)["NetworkInterfaces"]
            assert [g["GroupId"] for g in nic["Groups"]] == [group["GroupId"]]
        assert (await provider.get(first)).port == 8080
    finally:
        await delete_all(provider)
        await provider.close()
        await again.close()


async def test_a_group_found_is_brought_back_to_exactly_the_config(
    aws: AwsProvider, front: FaultFront, ec2: Any
) -> None:
    group_id = hand_made_group(ec2, GROUP, OUR_TAGS)
    ec2.authorize_security_group_ingress(
        GroupId=group_id,
        IpPermissions=[
            {
                "IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                "IpRanges": [{"CidrIp": "0.0.0.0/0"}],
            },
            {
                "IpProtocol": "tcp", "FromPort": 3128, "ToPort": 3128,
                "IpRanges": [{"CidrIp": "10.0.0.0/8"}, {"CidrIp": "127.0.0.0/8"}],
                "Ipv6Ranges": [{"CidrIpv6": "::/0"}],
            },
        ],
    )  # fmt: skip
    pid = await aws.create(request("px-found"))
    (group,) = groups_named(ec2, GROUP)
    assert group["GroupId"] == group_id
    assert ingress(group) == {("tcp", 3128, 3128, "127.0.0.0/8"), ("tcp", 3128, 3128, "::1/128")}
    assert front.count("CreateSecurityGroup") == 0
    (nic,) = described(ec2, pid)["NetworkInterfaces"]
    assert [g["GroupId"] for g in nic["Groups"]] == [group_id]


async def test_the_world_only_when_the_config_says_so(
    front: FaultFront, ec2: Any, image: str
) -> None:
    async with owned(
        AwsProvider(PROVIDER, config(front.url, image, allowedClients=["0.0.0.0/0"]))
    ) as provider:
        await provider.create(request("px-world"))
        (group,) = groups_named(ec2, GROUP)
        assert ingress(group) == {("tcp", 3128, 3128, "0.0.0.0/0")}


async def test_a_group_deleted_behind_its_back_is_made_again(
    aws: AwsProvider, front: FaultFront, ec2: Any
) -> None:
    first = await aws.create(request("px-r1"))
    (old,) = groups_named(ec2, GROUP)
    await aws.delete(first)
    ec2.delete_security_group(GroupId=old["GroupId"])
    # The provider still has the old id: EC2 (and the emulator) refuse the launch.
    with pytest.raises(Transient, match=r"InvalidGroup\.NotFound"):
        await aws.create(request("px-r2"))
    second = await aws.create(request("px-r2"))
    (new,) = groups_named(ec2, GROUP)
    assert new["GroupId"] != old["GroupId"]
    assert front.count("CreateSecurityGroup") == 2
    (nic,) = described(ec2, second)["NetworkInterfaces"]
    assert [g["GroupId"] for g in nic["Groups"]] == [new["GroupId"]]


# ----------------------------------------------------------------------------- leftovers


async def test_the_group_is_a_leftover_only_once_no_instance_is_left(
    aws: AwsProvider, front: FaultFront, ec2: Any
) -> None:
    first = await aws.create(request("px-l1"))
    ec2.stop_instances(InstanceIds=[first])
    assert await aws.leftovers() == []  # a stopped instance still holds it
    await aws.delete(first)
    (leftover,) = await aws.leftovers()
    (group,) = groups_named(ec2, GROUP)
    assert (leftover.provider_id, leftover.owner_uid, leftover.kind) == (
        group["GroupId"],
        OWNER,
        FIREWALL_KIND,
    )
    assert timedelta(0) <= datetime.now(UTC) - leftover.created_at < timedelta(minutes=5)
    assert await aws.delete_leftover(leftover)
    assert groups_named(ec2, GROUP) == []
    assert await aws.delete_leftover(leftover)  # gone already: the goal is reached
    second = await aws.create(request("px-l2"))  # made again by the next create
    (remade,) = groups_named(ec2, GROUP)
    assert remade["GroupId"] != leftover.provider_id
    (nic,) = described(ec2, second)["NetworkInterfaces"]
    assert [g["GroupId"] for g in nic["Groups"]] == [remade["GroupId"]]


async def test_a_group_in_use_again_is_kept(aws: AwsProvider, front: FaultFront, ec2: Any) -> None:
    await aws.delete(await aws.create(request("px-k1")))
    (leftover,) = await aws.leftovers()
    back = await aws.create(request("px-k2"))  # a create came back meanwhile
    assert await aws.delete_leftover(leftover) is False
    await aws.delete(back)
    # The instance listing lags (EC2 is eventually consistent): EC2 itself refuses.
    front.inject("DeleteSecurityGroup", "DependencyViolation", message="resource has a dependent")
    assert await aws.delete_leftover(leftover) is False
    assert [g["GroupId"] for g in groups_named(ec2, GROUP)] == [leftover.provider_id]


async def test_delete_leftover_touches_only_this_entrys_groups(
    aws: AwsProvider, front: FaultFront, ec2: Any
) -> None:
    theirs = hand_made_group(ec2, "someone-elses", {"team": "crawl"})
    other_entry = hand_made_group(
        ec2, firewall_name("aws-us"), {MANAGED_LABEL: "true", "egress-proxies/provider": "aws-us"}
    )
    for provider_id, kind in [
        (theirs, FIREWALL_KIND),
        (other_entry, FIREWALL_KIND),
        ("sg-../../x", FIREWALL_KIND),
        ("i-0123456789abcdef0", FIREWALL_KIND),
        (theirs, "volume"),
    ]:
        with pytest.raises(Permanent):
            await aws.delete_leftover(Leftover(provider_id, OWNER, EPOCH, kind))
    assert "DeleteSecurityGroup" not in front.actions
    assert len(groups_named(ec2, "someone-elses")) == 1
    assert await aws.leftovers() == []  # neither is this entry's


async def test_a_group_without_its_creation_tag_counts_as_old(aws: AwsProvider, ec2: Any) -> None:
    group_id = hand_made_group(ec2, GROUP, OUR_TAGS)
    assert await aws.leftovers() == [Leftover(group_id, OWNER, EPOCH, FIREWALL_KIND)]


# ----------------------------------------------------------------------------- GC


async def test_gc_sweeps_orphans_then_the_group_with_grace_and_dry_run(
    aws: AwsProvider, ec2: Any
) -> None:
    gone = await aws.create(request("px-gone", owner_uid="gone-owner"))
    live = await aws.create(request("px-live", owner_uid="live-owner"))
    providers = {PROVIDER: aws}
    now = datetime.now(UTC)

    young = await sweep_once(providers, {"live-owner"}, now, 3600.0)
    assert (young.orphans, young.providers[0].young, young.leftovers) == (0, 1, 0)

    dry = await sweep_once(providers, {"live-owner"}, now, 0.0, dry_run=True)
    assert [i.provider_id for i in dry.providers[0].orphans] == [gone]
    assert dry.deleted == 0
    assert {i.provider_id for i in await aws.list_by_tag()} == {gone, live}

    swept = await sweep_once(providers, {"live-owner"}, now, 0.0)
    assert swept.providers[0].deleted == [gone]
    assert swept.leftovers == 0  # the live instance holds the group
    assert [i.provider_id for i in await aws.list_by_tag()] == [live]

    await aws.delete(live)  # its proxy was deleted
    group_id = groups_named(ec2, GROUP)[0]["GroupId"]
    fresh = await sweep_once(providers, set(), datetime.now(UTC), 3600.0)
    assert fresh.leftovers == 0
    left = fresh.providers[0].leftovers
    assert left is not None
    assert left.young == 1  # made a moment ago: within the grace
    dry = await sweep_once(providers, set(), datetime.now(UTC), 0.0, dry_run=True)
    dry_left = dry.providers[0].leftovers
    assert dry_left is not None
    assert [lo.provider_id for lo in dry_left.orphans] == [group_id]
    assert dry_left.deleted == []
    assert groups_named(ec2, GROUP) != []
    done = await sweep_once(providers, set(), datetime.now(UTC), 0.0)
    assert done.providers[0].leftovers is not None
    assert done.providers[0].leftovers.deleted == [group_id]
    assert groups_named(ec2, GROUP) == []


async def test_the_collector_records_the_group_it_deletes(
    aws: AwsProvider, ec2: Any, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await aws.delete(await aws.create(request("px-ev")))
    group_id = groups_named(ec2, GROUP)[0]["GroupId"]
    gcol = GarbageCollector(
        conn.js,
        jetstream_store,
        {PROVIDER: aws},
        grace=0.0,
        lock=SweepLock(conn.js, ttl=30.0),
        registry=Metrics().registry,
    )
    try:
        report = await gcol.run_once()
    finally:
        await gcol.close()
    assert report is not None
    assert report.leftovers_deleted == 1
    events = list((await jetstream_store.read(subjects.gc(PROVIDER))).decoded())
    found = [e for e in events if isinstance(e, OrphanFound)]
    assert [(e.provider_id, e.kind, e.owner_uid) for e in found] == [
        (group_id, FIREWALL_KIND, OWNER)
    ]
    (deleted,) = [e for e in events if isinstance(e, OrphanDeleted)]
    assert (deleted.provider_id, deleted.ok) == (group_id, True)
    (completed,) = [e for e in events if isinstance(e, SweepCompleted)]
    assert (completed.leftovers, completed.leftovers_deleted) == (1, 1)
    assert groups_named(ec2, GROUP) == []


# ----------------------------------------------------------------------------- user data


async def test_the_vm_boots_with_the_squid_part_and_the_lease_part(
    aws: AwsProvider, front: FaultFront, ec2: Any, image: str
) -> None:
    keyed = lease_keyed(aws, b"m" * 32)
    pid = await keyed.create(request("px-ud", cloud_init="#cloud-config\npackages: [htop]\n"))
    parts = mime_parts(user_data(ec2, pid))
    # cloud-init runs script parts in name order: the metadata guard (D134), the Squid part,
    # then the lease part. Together they pass EC2's limit: the user data went gzip-compressed.
    assert sorted(parts) == ["part-001", GUARD_PART, SQUID_PART, LEASE_PART]
    assert "packages: [htop]" in parts["part-001"]
    assert "http_port 3128" in parts[SQUID_PART]
    assert "acl egress_clients src 127.0.0.0/8 ::1/128" in parts[SQUID_PART]
    assert "apt-get install -y -q squid" in parts[SQUID_PART]
    async with closing(AwsProvider(PROVIDER, config(front.url, image, installSquid=False))) as bare:
        plain = await bare.create(request("px-bare", cloud_init="#!/bin/sh\necho hi\n"))
        # The Proxy's own part, and the guard with the rules for the image's Squid (D134).
        bare_parts = mime_parts(user_data(ec2, plain))
        assert sorted(bare_parts) == ["part-001", GUARD_PART]
        assert bare_parts["part-001"] == "#!/bin/sh\necho hi\n"
        sent = [b for b in front.bodies if b["Action"] == ["RunInstances"]][-1]
        assert base64.b64decode(sent["UserData"][0]).decode() == user_data(ec2, plain)
