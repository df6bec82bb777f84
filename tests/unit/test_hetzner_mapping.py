"""The hetzner provider's pure translations: ids, labels, states, places and the firewall rule."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta, timezone

import pytest

from events.schemas import InstanceState
from services.providers.base import CREATED_AT_LABEL, MANAGED_LABEL, OWNER_LABEL
from services.providers.hetzner.pure import mapping

LOCATIONS = ("fsn1", "nbg1", "hel1")


def test_ids_round_trip_and_foreign_ones_are_refused() -> None:
    assert mapping.provider_id(40_000_001) == "40000001"
    assert mapping.parse_provider_id("40000001") == 40_000_001
    for bad in ("", "0", "-1", "01", "1.5", "abc", "zones/a/instances/b", "9" * 19, " 1"):
        assert mapping.parse_provider_id(bad) is None, bad
    assert mapping.firewall_leftover_id(7) == "firewalls/7"
    assert mapping.parse_firewall_leftover_id("firewalls/7") == 7
    for bad in ("7", "firewalls/", "firewalls/x", "volumes/7", "firewalls/7/x"):
        assert mapping.parse_firewall_leftover_id(bad) is None, bad


def test_our_label_keys_are_hetzner_keys_as_they_are() -> None:
    labels = mapping.server_labels("hz-eu", "8d3c7a2e-1f00-4c1b-9d7e-000000000001", "ab" * 40)
    assert labels == {
        MANAGED_LABEL: "true",
        mapping.PROVIDER_LABEL: "hz-eu",
        OWNER_LABEL: "8d3c7a2e-1f00-4c1b-9d7e-000000000001",
        mapping.SPEC_HASH_LABEL: ("ab" * 40)[:63],
    }
    assert mapping.bad_label(labels) is None
    assert mapping.SPEC_HASH_LABEL not in mapping.server_labels("hz", "o", "")


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("", True),
        ("a", True),
        ("Owner.1_x-Y", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("-a", False),
        ("a-", False),
        ("a/b", False),
        ("a b", False),
        ("ü", False),
        ("a:b", False),
    ],
)
def test_label_values_follow_hetzners_rule(value: str, ok: bool) -> None:
    found = mapping.bad_label({OWNER_LABEL: value})
    assert (found is None) is ok
    if not ok:
        assert found == (OWNER_LABEL, value)


def test_label_keys_follow_hetzners_rule() -> None:
    assert mapping.bad_label({"egress-proxies/owner-uid": "x"}) is None
    for key in ("", "/x", "a//b", "x/", "-a/b", "a/" + "b" * 64):
        assert mapping.bad_label({key: "x"}) == (key, "x")


def test_the_selector_and_the_entry_marks() -> None:
    assert mapping.label_selector("hz-eu") == (
        "egress-proxies/managed=true,egress-proxies/provider=hz-eu"
    )
    assert mapping.is_entrys({**mapping.entry_labels("hz-eu"), "x": "y"}, "hz-eu")
    assert not mapping.is_entrys(mapping.entry_labels("hz-us"), "hz-eu")
    assert not mapping.is_entrys({MANAGED_LABEL: "true"}, "hz-eu")
    assert not mapping.is_entrys(None, "hz-eu")


@pytest.mark.parametrize(
    ("status", "address", "state"),
    [
        ("initializing", "", InstanceState.PENDING),
        ("starting", "203.0.113.9", InstanceState.PENDING),
        ("running", "203.0.113.9", InstanceState.RUNNING),
        ("running", "", InstanceState.PENDING),
        ("migrating", "203.0.113.9", InstanceState.PENDING),
        ("rebuilding", "203.0.113.9", InstanceState.PENDING),
        ("stopping", "203.0.113.9", InstanceState.STOPPED),
        ("off", "203.0.113.9", InstanceState.STOPPED),
        ("deleting", "203.0.113.9", InstanceState.TERMINATING),
        ("unknown", "203.0.113.9", InstanceState.UNKNOWN),
        ("", "", InstanceState.UNKNOWN),
        ("hibernating", "203.0.113.9", InstanceState.UNKNOWN),
    ],
)
def test_states(status: str, address: str, state: InstanceState) -> None:
    assert mapping.state_of(status, address) is state


def test_the_public_address_prefers_ipv4_then_the_first_of_the_ipv6_network() -> None:
    assert mapping.public_address("203.0.113.9", "2001:db8:1::/64") == "203.0.113.9"
    assert mapping.public_address("", "2001:db8:1::/64") == "2001:db8:1::1"
    assert mapping.public_address("", "") == ""
    assert mapping.public_address("", "not a network") == ""


def test_creation_times_are_utc_and_a_missing_one_is_old() -> None:
    local = datetime(2026, 5, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    assert mapping.parse_created(local) == datetime(2026, 5, 1, 10, 0, tzinfo=UTC)
    assert mapping.parse_created(datetime(2026, 5, 1, 10, 0)).utcoffset() == timedelta(0)
    assert mapping.parse_created(None) == datetime(1970, 1, 1, tzinfo=UTC)
    labels = mapping.with_created_label({"a": "b"}, local)
    assert labels == {"a": "b", CREATED_AT_LABEL: local.isoformat()}


def place(name: str = "px-1", **placement: str) -> mapping.Place | str:
    fields = {"zone": "", "region": "", "machine_type": "", "image": "", **placement}
    return mapping.place(
        name=name,
        locations=LOCATIONS,
        default_type="cx23",
        default_image="debian-12",
        **fields,
    )


def test_a_place_from_the_defaults_is_spread_by_name_and_stable() -> None:
    chosen: Counter[str] = Counter()
    for i in range(300):
        got = place(f"px-{i}")
        assert isinstance(got, mapping.Place)
        assert got == place(f"px-{i}")
        assert (got.server_type, got.image) == ("cx23", "debian-12")
        chosen[got.location] += 1
    assert set(chosen) == set(LOCATIONS)
    assert min(chosen.values()) > 60


def test_the_placement_wins_field_by_field() -> None:
    assert place(zone="ash", machine_type="cpx12", image="ubuntu-24.04") == mapping.Place(
        "ash", "cpx12", "ubuntu-24.04"
    )
    assert place(region="hil") == mapping.Place("hil", "cx23", "debian-12")
    assert place(zone="hel1", region="hel1") == mapping.Place("hel1", "cx23", "debian-12")
    default = place()
    assert isinstance(default, mapping.Place)
    assert place(image="114690387") == mapping.Place(default.location, "cx23", "114690387")


@pytest.mark.parametrize(
    ("placement", "problem"),
    [
        ({"zone": "fsn1", "region": "eu-central"}, "differ; Hetzner has locations only"),
        ({"zone": "Falkenstein"}, "spec.placement.zone 'Falkenstein' is not a Hetzner location"),
        ({"region": "eu central"}, "spec.placement.region 'eu central'"),
        ({"machine_type": "CX22"}, "spec.placement.machineType 'CX22'"),
        ({"image": "debian 12"}, "spec.placement.image 'debian 12'"),
        ({"image": "../x"}, "spec.placement.image '../x'"),
    ],
)
def test_a_placement_hetzner_would_refuse_names_the_field(
    placement: dict[str, str], problem: str
) -> None:
    got = place(**placement)
    assert isinstance(got, str)
    assert problem in got


def test_the_firewall_rule_compares_by_meaning() -> None:
    wanted = mapping.wanted_rules(3128, ["203.0.113.0/24", "2001:db8::/32"])
    same = mapping.normalize_rule("in", "tcp", "3128", ["2001:0db8::/32", "203.0.113.0/24"])
    assert mapping.rules_match([same], wanted)
    assert not mapping.rules_match([], wanted)
    assert not mapping.rules_match([same, same], wanted)
    for other in (
        mapping.normalize_rule("in", "tcp", "3129", ["203.0.113.0/24", "2001:db8::/32"]),
        mapping.normalize_rule("in", "udp", "3128", ["203.0.113.0/24", "2001:db8::/32"]),
        mapping.normalize_rule("in", "tcp", "3128", ["203.0.113.0/24"]),
        mapping.normalize_rule("in", "tcp", "3128", ["0.0.0.0/0", "::/0"]),
        mapping.normalize_rule("in", "tcp", None, None),
    ):
        assert not mapping.rules_match([other], wanted), other
    # A source that is no network is kept as written, and so never matches.
    assert mapping.normalize_rule("in", "tcp", "1", ["junk"])[3] == frozenset({"junk"})
