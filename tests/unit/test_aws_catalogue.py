"""Where an instance type may launch, from EC2's catalogue: the zones left, the refusal naming
the field and where the type would work, and the kept answers' bounds in time and size."""

from __future__ import annotations

from services.providers.aws.pure.catalogue import (
    Placement,
    elsewhere,
    offered_locations,
    placement,
)
from services.providers.aws.pure.network import rules_text

REGION = "us-east-1"
ZONES = ("us-east-1a", "us-east-1b", "us-east-1e")


def where(offered: set[str], wanted: str = "", candidates: tuple[str, ...] = ZONES) -> Placement:
    return placement(
        "t3.nano",
        "instanceType",
        region=REGION,
        wanted_zone=wanted,
        candidates=candidates,
        offered=frozenset(offered),
    )


def test_the_catalogue_answer_is_read_for_the_type_asked_only() -> None:
    pages = [
        {
            "InstanceTypeOfferings": [
                {"InstanceType": "t3.nano", "Location": "us-east-1a"},
                {"InstanceType": "t3.micro", "Location": "us-east-1e"},
                {"InstanceType": "t3.nano", "Location": ""},
            ]
        },
        {"InstanceTypeOfferings": [{"InstanceType": "t3.nano", "Location": "us-east-1b"}]},
        {},
    ]
    assert offered_locations(pages, "t3.nano") == {"us-east-1a", "us-east-1b"}


def test_zones_without_the_type_are_left_out_and_the_others_kept_in_order() -> None:
    chosen = where({"us-east-1a", "us-east-1b", "us-east-1c"})
    assert chosen == placement(
        "t3.nano",
        "instanceType",
        region=REGION,
        wanted_zone="",
        candidates=ZONES,
        offered=frozenset({"us-east-1b", "us-east-1a"}),
    )
    assert chosen.zones == ("us-east-1a", "us-east-1b")
    assert chosen.problem == ""


def test_a_wanted_zone_without_the_type_names_spec_placement_zone_and_where_it_runs() -> None:
    chosen = where({"us-east-1a", "us-east-1b"}, wanted="us-east-1e")
    assert chosen.zones == ()
    assert chosen.problem == (
        "spec.placement.zone us-east-1e: instanceType t3.nano is not offered in that zone; it "
        "is offered in us-east-1a, us-east-1b: place instances there (zones, subnets or "
        "spec.placement.zone), or choose another type"
    )
    assert where({"us-east-1e"}, wanted="us-east-1e").zones == ("us-east-1e",)


def test_no_zone_offering_it_names_the_type_field_and_the_zones_elsewhere() -> None:
    chosen = where({"us-east-1c"}, candidates=("us-east-1a", "us-east-1e"))
    assert chosen.problem == (
        "instanceType t3.nano is not offered in us-east-1a, us-east-1e of us-east-1; it is "
        "offered in us-east-1c: place instances there (zones, subnets or spec.placement.zone), "
        "or choose another type"
    )
    nowhere = where(set())
    assert "no zone of us-east-1 offers it" in nowhere.problem


def test_other_regions_are_named_or_said_unknown() -> None:
    assert elsewhere(("eu-central-1", "eu-west-2"), "t3.nano") == (
        "regions offering t3.nano: eu-central-1, eu-west-2 (an entry per region)"
    )
    assert elsewhere((), "x9.huge") == "no region of this account offers x9.huge"
    assert "could not be asked" in elsewhere(None, "t3.nano")


def test_rules_are_shown_as_a_person_reads_them() -> None:
    assert rules_text(
        [
            {
                "IpProtocol": "tcp",
                "FromPort": 3128,
                "ToPort": 3128,
                "IpRanges": [{"CidrIp": "203.0.113.0/24"}],
                "Ipv6Ranges": [{"CidrIpv6": "2001:db8::/32"}],
            },
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-1"}]},
            {"IpProtocol": "6", "FromPort": 22, "ToPort": 23},
        ]
    ) == (
        "tcp 3128 from 203.0.113.0/24, 2001:db8::/32; any protocol all ports from sg-1; "
        "tcp 22-23 from nowhere"
    )
