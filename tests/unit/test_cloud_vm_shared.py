"""What the cloud VM providers share, without a cloud: the settings every block has, the Squid
part of a VM's user data, spreading over zones, and the firewall's name."""

from __future__ import annotations

import collections
import email.parser
import email.policy
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.providers.cloud.pure.firewall import firewall_name, firewall_owner
from services.providers.cloud.pure.settings import (
    MAX_CLIENT_RANGES,
    CloudSettings,
    check_cloud_settings,
    client_networks,
)
from services.providers.cloud.pure.spread import spread
from services.providers.cloud.pure.userdata import PART_NAME, squid_script, vm_user_data
from services.providers.squidauth.pure.cloudinit import PART_NAME as LEASE_PART
from services.providers.squidauth.pure.cloudinit import with_lease_auth


def settings(**fields: Any) -> CloudSettings:
    return msgspec.convert({"allowedClients": ["203.0.113.0/24"], **fields}, CloudSettings)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"allowedClients": []}, "allowedClients is required"),
        ({"allowedClients": ["203.0.113.1/24"]}, "'203.0.113.1/24' is not a CIDR"),
        ({"allowedClients": ["crawlers"]}, "'crawlers' is not a CIDR"),
        ({"allowedClients": ["10.0.0.0/33"]}, "'10.0.0.0/33' is not a CIDR"),
        (
            {"allowedClients": [f"10.0.{i}.0/24" for i in range(MAX_CLIENT_RANGES + 1)]},
            "merge them into larger ranges",
        ),
        ({"endpointUrl": "ftp://x"}, "endpointUrl 'ftp://x'"),
        ({"endpointUrl": "http://x/v2"}, "(no path)"),
        ({"endpointUrl": "http://"}, "endpointUrl"),
    ],
)
def test_each_bad_shared_field_is_named_with_its_fix(fields: dict[str, Any], problem: str) -> None:
    assert problem in check_cloud_settings(settings(**fields))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"proxyPort": 0}, "proxyPort"),
        ({"proxyPort": 65536}, "proxyPort"),
        ({"proxyPort": "3128"}, "proxyPort"),
        ({"timeoutSeconds": 0}, "timeoutSeconds"),
        ({"timeoutSeconds": float("nan")}, "timeoutSeconds"),
        ({"installSquid": "yes"}, "installSquid"),
        ({"allowedClients": "10.0.0.0/8"}, "allowedClients"),
        ({"allowedclients": ["10.0.0.0/8"]}, "allowedclients"),
    ],
)
def test_wrong_types_and_bounds_are_refused_by_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=field):
        settings(**fields)


def test_good_settings_pass_and_list_their_networks_canonically() -> None:
    good = settings(allowedClients=["2001:db8::/32", "203.0.113.0/24", "10.0.0.0/8"])
    assert check_cloud_settings(good) == ""
    assert client_networks(good) == ["10.0.0.0/8", "203.0.113.0/24", "2001:db8::/32"]
    assert check_cloud_settings(settings(allowedClients=["0.0.0.0/0", "::/0"])) == ""


def parts(user_data: str) -> dict[str, str]:
    message = email.parser.Parser(policy=email.policy.default).parsestr(user_data)
    return {str(part.get_filename()): str(part.get_content()) for part in message.iter_parts()}


def test_the_squid_part_follows_the_proxys_own_and_precedes_the_lease_part() -> None:
    own = "#cloud-config\npackages: [htop]\n"
    keyed = with_lease_auth(own, "ab" * 32, "print('helper')\n", fence_floor=7)
    got = parts(vm_user_data(keyed, settings(proxyPort=8080), "aws-eu"))
    assert list(got) == ["part-001", LEASE_PART, PART_NAME]
    # cloud-init runs script parts by name: ours before the lease part, whatever the order here.
    assert sorted([PART_NAME, LEASE_PART]) == [PART_NAME, LEASE_PART]
    assert got["part-001"] == own
    script = got[PART_NAME]
    assert "http_port 8080\n" in script
    assert "acl egress_clients src 203.0.113.0/24\n" in script
    # conf.d (where the lease part's deny goes) is read before any allow.
    assert script.index("include /etc/squid/conf.d/*.conf") < script.index("http_access allow")
    assert script.rstrip().endswith("fi")


def test_without_install_squid_the_user_data_is_left_as_given() -> None:
    assert vm_user_data("#cloud-config\n", settings(installSquid=False), "x") == "#cloud-config\n"
    alone = parts(vm_user_data("", settings(), "x"))
    assert list(alone) == [PART_NAME]


def test_the_squid_script_hides_clients_and_keeps_no_cache() -> None:
    script = squid_script(settings(), "do-ams")
    for line in ("cache deny all", "forwarded_for delete", "via off", "http_access deny all"):
        assert f"\n{line}\n" in script
    assert "pid_filename /run/squid.pid" in script


@given(st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=8, unique=True))
def test_spread_is_stable_and_picks_one_of_the_choices(choices: list[str]) -> None:
    for key in ("px-a", "px-b", "\udcff"):
        assert spread(choices, key) in choices
        assert spread(choices, key) == spread(list(choices), key)


def test_spread_shares_names_out_evenly() -> None:
    zones = ["a", "b", "c"]
    counts = collections.Counter(spread(zones, f"px-{i}") for i in range(3000))
    assert set(counts) == set(zones)
    assert min(counts.values()) > 900  # a fair share is 1000; a stuck hash would give 0 or 3000


def test_spread_over_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="nothing to spread"):
        spread([], "px")


@pytest.mark.parametrize(
    ("provider", "name"),
    [
        ("aws-eu", "egress-proxies-aws-eu"),
        ("DO_Ams3", "egress-proxies-do-ams3"),
        ("__", "egress-proxies-default"),
        ("x" * 63, "egress-proxies-" + "x" * 48),
    ],
)
def test_the_firewall_name_is_one_every_cloud_accepts(provider: str, name: str) -> None:
    assert firewall_name(provider) == name
    assert len(name) <= 63


def test_a_firewall_owner_is_never_a_proxy_uid() -> None:
    assert firewall_owner("aws-eu") == "firewall:aws-eu"
