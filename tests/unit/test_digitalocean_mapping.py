"""DigitalOcean tags <-> our labels, droplet states, ids, and the firewall's rules: pure tables."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.schemas import InstanceState
from services.providers.base import CREATED_AT_LABEL, MANAGED_LABEL, OWNER_LABEL
from services.providers.digitalocean.pure import mapping
from services.providers.digitalocean.pure.mapping import (
    PROVIDER_LABEL,
    SPEC_HASH_LABEL,
    TagError,
    droplet_of,
    droplet_tags,
    firewall_body,
    firewall_differs,
    labels_from_tags,
    state_of,
)

UID = "8d3c7a2e-1f00-4c1b-9d7e-000000000001"


def test_tags_carry_every_label_and_read_back() -> None:
    tags = droplet_tags("DO-Ams", UID, "0123abcd")
    assert tags == [
        "egress-proxies-managed",
        "egress-proxies-provider:do-ams",
        f"egress-proxies-owner:{UID}",
        "egress-proxies-spec:0123abcd",
    ]
    assert labels_from_tags([*tags, "team:crawl", "web"]) == {
        MANAGED_LABEL: "true",
        PROVIDER_LABEL: "do-ams",
        OWNER_LABEL: UID,
        SPEC_HASH_LABEL: "0123abcd",
    }
    assert mapping.is_managed_by(tags, "do-ams")
    assert mapping.is_managed_by(tags, "DO-AMS")
    assert not mapping.is_managed_by(tags, "do-fra")
    assert not mapping.is_managed_by(tags[1:], "do-ams")  # not marked managed


def test_an_empty_spec_hash_is_no_tag() -> None:
    assert droplet_tags("do", "u1", "") == [
        "egress-proxies-managed",
        "egress-proxies-provider:do",
        "egress-proxies-owner:u1",
    ]


@pytest.mark.parametrize(
    ("owner", "spec_hash", "named"),
    [
        ("", "h", "the proxy uid (owner) ''"),
        ("Owner/With Slash", "h", "the proxy uid (owner) 'Owner/With Slash'"),
        ("uid with spaces", "h", "the proxy uid (owner)"),
        ("ünïcode", "h", "the proxy uid (owner)"),
        ("u" * 235, "h", "at most 234 characters"),
        ("u1", "hash/with/slash", "the spec hash 'hash/with/slash'"),
        ("u1", "h\n", "the spec hash"),
    ],
)
def test_a_value_no_tag_can_carry_is_refused_naming_it(
    owner: str, spec_hash: str, named: str
) -> None:
    with pytest.raises(TagError) as caught:
        droplet_tags("do", owner, spec_hash)
    assert named in str(caught.value)


def test_the_longest_owner_uid_still_fits_a_tag() -> None:
    (owner_tag,) = [t for t in droplet_tags("do", "u" * 234, "") if "owner" in t]
    assert len(owner_tag) == 255


@given(st.from_regex(r"[A-Za-z0-9:_-]{1,60}", fullmatch=True))
def test_any_valid_uid_round_trips(uid: str) -> None:
    assert labels_from_tags(droplet_tags("do", uid, "h"))[OWNER_LABEL] == uid


def test_an_owner_tagged_twice_by_hand_is_no_owner() -> None:
    labels = labels_from_tags(
        ["egress-proxies-managed", "egress-proxies-owner:a", "egress-proxies-owner:b"]
    )
    assert OWNER_LABEL not in labels
    assert labels[MANAGED_LABEL] == "true"
    assert (
        labels_from_tags(["egress-proxies-owner:a", "egress-proxies-owner:a"])[OWNER_LABEL] == "a"
    )


@pytest.mark.parametrize(
    ("status", "ip", "state"),
    [
        ("new", "", InstanceState.PENDING),
        ("new", "203.0.113.9", InstanceState.PENDING),
        ("active", "", InstanceState.PENDING),
        ("active", "203.0.113.9", InstanceState.RUNNING),
        ("off", "203.0.113.9", InstanceState.STOPPED),
        ("archive", "", None),
        ("something-new", "", InstanceState.UNKNOWN),
        ("", "", InstanceState.UNKNOWN),
    ],
)
def test_states(status: str, ip: str, state: InstanceState | None) -> None:
    assert state_of(status, ip) is state


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("3164444", 3164444),
        ("1", 1),
        ("0", None),
        ("-1", None),
        ("03164444", None),
        ("", None),
        ("3164444 ", None),
        ("zones/a/instances/b", None),
        ("9" * 19, None),
        ("١٢٣", None),  # Arabic-Indic digits: isdigit() is not enough
    ],
)
def test_droplet_ids(value: str, parsed: int | None) -> None:
    assert mapping.parse_droplet_id(value) == parsed


def test_firewall_leftover_ids_round_trip_and_refuse_others() -> None:
    fid = "bb4b2611-3d72-467b-8602-280330ecd65c"
    assert mapping.parse_firewall_id(mapping.firewall_leftover_id(fid)) == fid
    for bad in (fid, "firewalls/x", f"firewalls/{fid}/../y", "volumes/" + fid, ""):
        assert mapping.parse_firewall_id(bad) is None


def droplet(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": 3164444,
        "name": "px-a",
        "status": "active",
        "created_at": "2020-07-21T18:37:44Z",
        "networks": {
            "v4": [
                {"ip_address": "10.128.192.124", "type": "private"},
                {"ip_address": "192.241.165.154", "type": "public"},
            ],
            "v6": [{"ip_address": "2604:a880::1", "type": "public"}],
        },
        "tags": ["egress-proxies-managed", "egress-proxies-owner:u1"],
    }
    base.update(fields)
    return base


def test_a_droplet_is_read_from_digitaloceans_shape() -> None:
    found = droplet_of(droplet())
    assert found is not None
    assert (found.id, found.name, found.status, found.ip) == (
        3164444,
        "px-a",
        "active",
        "192.241.165.154",
    )
    assert found.created_at == datetime(2020, 7, 21, 18, 37, 44, tzinfo=UTC)
    assert found.state is InstanceState.RUNNING
    labels = found.labels()
    assert labels[OWNER_LABEL] == "u1"
    assert labels[CREATED_AT_LABEL] == "2020-07-21T18:37:44+00:00"


@pytest.mark.parametrize(
    "broken",
    [
        {"networks": None},
        {"networks": {"v4": "x"}},
        {"networks": {"v4": [None, {"type": "public"}, {"type": "public", "ip_address": ""}]}},
        {"tags": None},
        {"tags": [1, None]},
        {"created_at": "yesterday"},
        {"created_at": None},
        {"name": None, "status": None},
    ],
)
def test_missing_or_odd_fields_do_not_crash(broken: dict[str, Any]) -> None:
    found = droplet_of(droplet(**broken))
    assert found is not None
    assert found.created_at.tzinfo is not None


@pytest.mark.parametrize("bad_id", [None, "3164444", 0, -5, True, 1.5])
def test_an_answer_without_a_numeric_id_is_no_droplet(bad_id: object) -> None:
    assert droplet_of(droplet(id=bad_id)) is None


def test_a_firewall_opens_the_port_to_the_clients_only_and_lets_everything_out() -> None:
    body = firewall_body("egress-proxies-do", "DO", 3128, ["198.51.100.0/24", "2001:db8::/32"])
    assert body["name"] == "egress-proxies-do"
    assert body["tags"] == ["egress-proxies-provider:do"]
    assert body["inbound_rules"] == [
        {
            "protocol": "tcp",
            "ports": "3128",
            "sources": {"addresses": ["198.51.100.0/24", "2001:db8::/32"]},
        }
    ]
    outbound = {
        (r["protocol"], tuple(r["destinations"]["addresses"])) for r in body["outbound_rules"]
    }
    assert outbound == {(p, ("0.0.0.0/0", "::/0")) for p in ("tcp", "udp", "icmp")}
    assert firewall_differs(body, "do", 3128, ["198.51.100.0/24", "2001:db8::/32"]) == []


def test_every_rule_carries_the_ports_the_api_requires_icmp_its_zero() -> None:
    body = firewall_body("f", "do", 3128, ["198.51.100.0/24"])
    rules = body["inbound_rules"] + body["outbound_rules"]
    assert all(isinstance(r.get("ports"), str) and r["ports"] for r in rules)
    assert [r["ports"] for r in body["outbound_rules"] if r["protocol"] == "icmp"] == ["0"]


def test_a_firewall_made_before_icmp_sent_its_ports_needs_no_update() -> None:
    """The API answered such a rule with ports "0" all along: no PUT for it."""
    body = firewall_body("f", "do", 3128, ["198.51.100.0/24"])
    before = [dict(r) for r in body["outbound_rules"]]
    for rule in before:
        if rule["protocol"] == "icmp":
            rule.pop("ports", None)
    assert (
        firewall_differs({**body, "outbound_rules": before}, "do", 3128, ["198.51.100.0/24"]) == []
    )


def as_digitalocean_returns(body: dict[str, Any]) -> dict[str, Any]:
    """DigitalOcean may spell "all ports" as "0" or "all" and order rules and addresses freely."""
    returned = dict(body)
    returned["outbound_rules"] = [
        {**rule, "ports": "0"} for rule in reversed(body["outbound_rules"])
    ]
    inbound = body["inbound_rules"][0]
    returned["inbound_rules"] = [
        {**inbound, "sources": {"addresses": list(reversed(inbound["sources"]["addresses"]))}}
    ]
    return returned


def test_the_same_rules_spelt_differently_need_no_update() -> None:
    body = firewall_body("f", "do", 3128, ["198.51.100.0/24", "203.0.113.7/32"])
    assert (
        firewall_differs(
            as_digitalocean_returns(body), "do", 3128, ["198.51.100.0/24", "203.0.113.7/32"]
        )
        == []
    )


@pytest.mark.parametrize(
    ("port", "clients", "changes", "differs"),
    [
        (3128, ["198.51.100.0/24", "192.0.2.0/24"], {}, ["inbound_rules"]),
        (8080, ["198.51.100.0/24"], {}, ["inbound_rules"]),
        (3128, ["198.51.100.0/24"], {"tags": []}, ["tags"]),
        (3128, ["198.51.100.0/24"], {"tags": None}, ["tags"]),
        (3128, ["198.51.100.0/24"], {"outbound_rules": []}, ["outbound_rules"]),
        (3128, ["198.51.100.0/24"], {"inbound_rules": None}, ["inbound_rules"]),
        (
            3128,
            ["198.51.100.0/24"],
            {
                "inbound_rules": [
                    {
                        "protocol": "tcp",
                        "ports": "3128",
                        "sources": {"addresses": ["198.51.100.0/24"]},
                    },
                    {"protocol": "tcp", "ports": "22", "sources": {"addresses": ["0.0.0.0/0"]}},
                ]
            },
            ["inbound_rules"],
        ),
        (
            3128,
            ["198.51.100.0/24"],
            {
                "inbound_rules": [
                    {
                        "protocol": "tcp",
                        "ports": "3128",
                        "sources": {"addresses": ["198.51.100.0/24"], "tags": ["web"]},
                    }
                ]
            },
            ["inbound_rules"],
        ),
    ],
)
def test_a_firewall_that_is_not_as_wanted_says_what(
    port: int, clients: list[str], changes: dict[str, Any], differs: list[str]
) -> None:
    existing = {**firewall_body("f", "do", 3128, ["198.51.100.0/24"]), **changes}
    assert firewall_differs(existing, "do", port, clients) == differs


def test_listing_answers_say_whether_a_page_follows() -> None:
    assert mapping.next_page({"links": {"pages": {"next": "https://x?page=2"}}})
    answers: list[dict[str, Any]] = [
        {},
        {"links": {}},
        {"links": {"pages": {"last": "x"}}},
        {"links": None},
    ]
    for answer in answers:
        assert not mapping.next_page(answer)
