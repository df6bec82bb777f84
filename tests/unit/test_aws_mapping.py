"""The pure translations of the aws provider: states, tags, filters, instances read from
DescribeInstances, the subnet an instance goes to, and the security group's rule changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.schemas import InstanceState
from services.providers.aws.pure import mapping
from services.providers.aws.pure.network import (
    Subnet,
    choose_subnet,
    desired_rules,
    permissions_for,
    rule_changes,
)
from services.providers.base import CREATED_AT_LABEL, MANAGED_LABEL, OWNER_LABEL

# ----------------------------------------------------------------------------- states


@pytest.mark.parametrize(
    ("name", "ip", "expected"),
    [
        ("pending", "", InstanceState.PENDING),
        ("running", "203.0.113.9", InstanceState.RUNNING),
        ("running", "", InstanceState.PENDING),  # no address yet: no proxy URL
        ("stopping", "203.0.113.9", InstanceState.STOPPED),
        ("stopped", "", InstanceState.STOPPED),  # a spot interruption with behaviour stop
        ("shutting-down", "", InstanceState.TERMINATING),
        ("rebooting", "", InstanceState.UNKNOWN),
        ("", "", InstanceState.UNKNOWN),
    ],
)
def test_state_of(name: str, ip: str, expected: InstanceState) -> None:
    assert mapping.state_of(name, ip) is expected


def test_every_live_state_but_terminated_is_listed_and_a_namesake_is_not_on_its_way_out() -> None:
    assert "terminated" not in mapping.LIVE_STATES
    assert set(mapping.NAMESAKE_STATES) == set(mapping.LIVE_STATES) - {"shutting-down"}


# ----------------------------------------------------------------------------- tags, filters


def test_our_keys_are_ec2_tag_keys_as_they_are() -> None:
    tags = mapping.instance_tags("px-1", "uid-1", "aws-eu", "abc")
    assert tags == {
        "Name": "px-1",
        MANAGED_LABEL: "true",
        OWNER_LABEL: "uid-1",
        "egress-proxies/provider": "aws-eu",
        "egress-proxies/spec-hash": "abc",
    }
    assert "egress-proxies/spec-hash" not in mapping.instance_tags("px-1", "u", "aws-eu", "")
    for key in tags:
        assert len(key) <= 128
        assert not key.lower().startswith("aws:")
    assert mapping.tag_list({"a": "1"}) == [{"Key": "a", "Value": "1"}]


@pytest.mark.parametrize(
    ("owner", "problem"),
    [
        ("", "tag egress-proxies/owner-uid is empty"),
        ("u" * 257, "is 257 characters long"),
        ("uid\n2", "control characters"),
        (" uid", "surrounding spaces"),
        ("uid\x7f", "control characters"),
    ],
)
def test_tags_ec2_would_refuse_are_named(owner: str, problem: str) -> None:
    assert problem in mapping.tag_problem(mapping.instance_tags("px", owner, "aws-eu", "h"))


def test_firewall_tags_carry_its_own_creation_time() -> None:
    made = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    tags = mapping.firewall_tags("egress-proxies-aws-eu", "firewall:aws-eu", "aws-eu", made)
    assert tags[CREATED_AT_LABEL] == "2026-01-02T01:04:05+00:00"
    assert tags[OWNER_LABEL] == "firewall:aws-eu"
    assert mapping.tag_problem(tags) == ""


def test_filters_select_this_entry_in_the_states_asked() -> None:
    assert mapping.managed_filters("aws-eu") == [
        {"Name": "tag:egress-proxies/managed", "Values": ["true"]},
        {"Name": "tag:egress-proxies/provider", "Values": ["aws-eu"]},
        {"Name": "instance-state-name", "Values": list(mapping.LIVE_STATES)},
    ]
    namesake = mapping.namesake_filters("aws-eu", "px-1")
    assert namesake[0] == {"Name": "tag:Name", "Values": ["px-1"]}
    assert namesake[-1]["Values"] == list(mapping.NAMESAKE_STATES)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (datetime(2026, 1, 1, 12, tzinfo=UTC), datetime(2026, 1, 1, 12, tzinfo=UTC)),
        (datetime(2026, 1, 1, 12), datetime(2026, 1, 1, 12, tzinfo=UTC)),
        ("2026-01-01T14:00:00+02:00", datetime(2026, 1, 1, 12, tzinfo=UTC)),
        ("yesterday", mapping.EPOCH),
        (None, mapping.EPOCH),
        (12345, mapping.EPOCH),
    ],
)
def test_parse_time(value: object, expected: datetime) -> None:
    parsed = mapping.parse_time(value)
    assert parsed == expected
    assert parsed.utcoffset() == timedelta(0)


def raw_instance(**fields: Any) -> dict[str, Any]:
    return {
        "InstanceId": "i-0123456789abcdef0",
        "State": {"Code": 16, "Name": "running"},
        "PublicIpAddress": "203.0.113.9",
        "LaunchTime": datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=1))),
        "Tags": [
            {"Key": "Name", "Value": "px-1"},
            {"Key": MANAGED_LABEL, "Value": "true"},
            {"Key": OWNER_LABEL, "Value": "uid-1"},
            {"Key": "team", "Value": "crawl"},
            {"Key": 7, "Value": "malformed"},
        ],
        **fields,
    }


def test_an_instance_is_read_from_describe_instances() -> None:
    instance = mapping.to_instance(raw_instance(), port=8080)
    assert instance.provider_id == instance.instance_uid == "i-0123456789abcdef0"
    assert (instance.name, instance.owner_uid, instance.state) == (
        "px-1",
        "uid-1",
        InstanceState.RUNNING,
    )
    assert instance.url == "http://203.0.113.9:8080"
    assert instance.created_at == datetime(2026, 1, 1, 11, tzinfo=UTC)
    assert instance.labels == {
        MANAGED_LABEL: "true",
        OWNER_LABEL: "uid-1",
        CREATED_AT_LABEL: "2026-01-01T11:00:00+00:00",
    }


def test_a_bare_instance_reads_without_crashing() -> None:
    instance = mapping.to_instance({"InstanceId": "i-0123456789abcdef0"}, port=3128)
    assert (instance.state, instance.ip, instance.owner_uid, instance.created_at) == (
        InstanceState.UNKNOWN,
        "",
        "",
        mapping.EPOCH,
    )


def test_instances_of_pages() -> None:
    pages: list[dict[str, Any]] = [
        {"Reservations": [{"Instances": [{"InstanceId": "a"}, {"InstanceId": "b"}]}]},
        {"Reservations": []},
        {},
        {"Reservations": [{"Instances": [{"InstanceId": "c"}]}, {}]},
    ]
    assert [i["InstanceId"] for i in mapping.instances_of(pages)] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("i-0123456789abcdef0", True),
        ("i-01234567", True),
        ("i-0123", False),
        ("i-0123456789ABCDEF0", False),
        ("never-created-0", False),
        ("i-0123456789abcdef0\n", False),
        ("", False),
    ],
)
def test_instance_ids(value: str, ok: bool) -> None:
    assert bool(mapping.INSTANCE_ID.match(value)) is ok


# ----------------------------------------------------------------------------- subnets

SUBNETS = [
    Subnet("eu-west-1a", "subnet-aaaa0001"),
    Subnet("eu-west-1a", "subnet-aaaa0002"),
    Subnet("eu-west-1b", "subnet-bbbb0001"),
    Subnet("eu-west-1c", "subnet-cccc0001"),
]


def test_the_placement_zone_wins_then_the_zones_then_every_subnet() -> None:
    placed = choose_subnet(SUBNETS, ["eu-west-1a"], "eu-west-1c", "px-1")
    assert placed == Subnet("eu-west-1c", "subnet-cccc0001")
    for n in range(20):
        chosen = choose_subnet(SUBNETS, ["eu-west-1a", "eu-west-1b"], "", f"px-{n}")
        assert isinstance(chosen, Subnet)
        assert chosen.zone in ("eu-west-1a", "eu-west-1b")
    spread = {choose_subnet(SUBNETS, [], "", f"px-{n}") for n in range(40)}
    assert spread == set(SUBNETS)


def test_the_choice_is_stable_and_does_not_depend_on_listing_order() -> None:
    first = choose_subnet(SUBNETS, ["eu-west-1a", "eu-west-1b"], "", "px-stable")
    again = choose_subnet(list(reversed(SUBNETS)), ["eu-west-1a", "eu-west-1b"], "", "px-stable")
    assert first == again


def test_a_zone_without_a_subnet_is_named_with_its_field() -> None:
    problem = choose_subnet(SUBNETS, [], "eu-west-1d", "px")
    assert isinstance(problem, str)
    assert "spec.placement.zone: zone 'eu-west-1d' has no subnet" in problem
    assert "eu-west-1a, eu-west-1b, eu-west-1c" in problem
    problem = choose_subnet(SUBNETS, ["eu-west-1d"], "", "px")
    assert isinstance(problem, str)
    assert problem.startswith("zones: zone 'eu-west-1d'")
    assert "the VPC has none" in str(choose_subnet([], [], "", "px"))


@given(st.lists(st.sampled_from(SUBNETS), min_size=1), st.text(max_size=40))
def test_any_key_gets_one_of_the_subnets(subnets: list[Subnet], key: str) -> None:
    assert choose_subnet(subnets, [], "", key) in subnets


# ----------------------------------------------------------------------------- rules


def test_a_new_group_gets_every_range_in_one_permission() -> None:
    changes = rule_changes([], 3128, ["2001:db8::/48", "203.0.113.0/24", "127.0.0.0/8"])
    assert changes.revoke == []
    assert changes.authorize == [
        {
            "IpProtocol": "tcp",
            "FromPort": 3128,
            "ToPort": 3128,
            "IpRanges": [{"CidrIp": "127.0.0.0/8"}, {"CidrIp": "203.0.113.0/24"}],
            "Ipv6Ranges": [{"CidrIpv6": "2001:db8::/48"}],
        }
    ]


def test_a_group_as_configured_needs_nothing() -> None:
    present = permissions_for(desired_rules(3128, ["203.0.113.0/24", "2001:db8::/48"]))
    present[0]["IpProtocol"] = "6"  # EC2 may name TCP by number
    assert not rule_changes(present, 3128, ["203.0.113.0/24", "2001:0db8:0::/48"])


def test_everything_else_is_revoked() -> None:
    present: list[dict[str, Any]] = [
        {
            "IpProtocol": "tcp",
            "FromPort": 3128,
            "ToPort": 3128,
            "IpRanges": [{"CidrIp": "203.0.113.0/24"}, {"CidrIp": "10.0.0.0/8"}],
            "Ipv6Ranges": [{"CidrIpv6": "::/0"}],
        },
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-0123456789abcdef0"}]},
    ]
    changes = rule_changes(present, 3128, ["203.0.113.0/24", "198.51.100.0/24"])
    assert changes.revoke == [
        {
            "IpProtocol": "tcp",
            "FromPort": 3128,
            "ToPort": 3128,
            "IpRanges": [{"CidrIp": "10.0.0.0/8"}],
            "Ipv6Ranges": [{"CidrIpv6": "::/0"}],
        },
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-0123456789abcdef0"}]},
    ]
    assert changes.authorize == [
        {
            "IpProtocol": "tcp",
            "FromPort": 3128,
            "ToPort": 3128,
            "IpRanges": [{"CidrIp": "198.51.100.0/24"}],
        }
    ]


def test_another_port_is_another_rule() -> None:
    present = permissions_for(desired_rules(3128, ["203.0.113.0/24"]))
    changes = rule_changes(present, 8080, ["203.0.113.0/24"])
    assert [p["FromPort"] for p in changes.revoke] == [3128]
    assert [p["FromPort"] for p in changes.authorize] == [8080]
