"""What the cloud VM providers share, without a cloud: the settings every block has, the Squid
part of a VM's user data, spreading over zones, and the firewall's name."""

from __future__ import annotations

import collections
import email.parser
import email.policy
import re
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.providers.base import Leftover, Permanent
from services.providers.cloud.pure.firewall import FIREWALL_KIND, firewall_name, firewall_owner
from services.providers.cloud.pure.guard import PART_NAME as GUARD_PART
from services.providers.cloud.pure.guard import SNIPPET_PATH
from services.providers.cloud.pure.leftovers import firewall_id_of, firewall_leftovers
from services.providers.cloud.pure.settings import (
    MAX_CLIENT_RANGES,
    CloudSettings,
    check_cloud_settings,
    client_networks,
    count_problem,
    each_problem,
    loopback_host,
    places_problem,
    plain_http_problem,
    shown,
    ssh_keys_problem,
    token_api_problem,
    token_file_problem,
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
    assert list(got) == ["part-001", LEASE_PART, GUARD_PART, PART_NAME]
    # cloud-init runs script parts by name: the guard, then Squid's, then the lease part,
    # whatever the order here.
    assert sorted([PART_NAME, LEASE_PART, GUARD_PART]) == [GUARD_PART, PART_NAME, LEASE_PART]
    assert got["part-001"] == own
    script = got[PART_NAME]
    assert "http_port 8080\n" in script
    assert "acl egress_clients src 203.0.113.0/24\n" in script
    # conf.d (where the lease part's deny goes) is read before any allow.
    assert script.index("include /etc/squid/conf.d/*.conf") < script.index("http_access allow")
    assert script.rstrip().endswith("fi")


def test_without_install_squid_the_image_squid_gets_the_guard_and_its_rules() -> None:
    got = parts(vm_user_data("#cloud-config\n", settings(installSquid=False), "x"))
    assert list(got) == ["part-001", GUARD_PART]
    assert got["part-001"] == "#cloud-config\n"
    assert "http_access deny egress_to_link_local\n" in got[GUARD_PART]
    alone = parts(vm_user_data("", settings(), "x"))
    assert list(alone) == [GUARD_PART, PART_NAME]
    assert SNIPPET_PATH not in alone[GUARD_PART]  # the Squid part's own config has the rules


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


# ----------------------------------------------------------------------------- shared field rules

SLUG = re.compile(r"^[a-z]{2,8}[0-9]{1,3}\Z")


def places(values: list[str], *, required: str = "list one, e.g. [fra1]") -> str:
    return places_problem(
        "regions",
        values,
        3,
        noun="a region",
        pattern=SLUG,
        what="a region slug; use e.g. fra1",
        required=required,
    )


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ([], "regions is empty; list one, e.g. [fra1]"),
        (["fra1"] * 4, "regions has 4 entries; at most 3"),
        (["fra1", "Frankfurt"], "regions: 'Frankfurt' is not a region slug; use e.g. fra1"),
        (["fra1", "ams3", "fra1"], "regions: 'fra1' is listed twice; list each once"),
        (["fra1", "fra1"], "lists a region twice"),
        (["x" * 500], "regions: 'xxxx"),
    ],
)
def test_a_list_of_places_names_its_first_problem_and_the_fix(
    values: list[str], problem: str
) -> None:
    assert problem in places(values)


def test_a_good_list_of_places_passes_and_an_optional_one_may_be_empty() -> None:
    assert places(["fra1", "ams3", "nyc3"]) == ""
    assert places([], required="") == ""
    # Without a pattern only the count and the repeats are checked (a caller checks each).
    assert places_problem("zones", ["Any Thing"], 2, noun="a zone") == ""
    assert "listed twice" in places_problem("zones", ["z", "z"], 2, noun="a zone")


def test_counts_and_patterns_alone() -> None:
    assert count_problem("sshKeys", ["k"] * 3, 2, unit="keys") == "sshKeys has 3 keys; at most 2"
    assert count_problem("sshKeys", [], 2) == ""  # optional unless required says what to list
    assert each_problem("sshKeys", ["ok", "no way"], re.compile(r"^\S+\Z"), "a key") == (
        "sshKeys: 'no way' is not a key"
    )
    assert each_problem("sshKeys", ["ok"], re.compile(r"^\S+\Z"), "a key") == ""

    key = re.compile(r"^[0-9]+\Z")
    assert ssh_keys_problem(["1", "2"], 2, key, "a key id") == ""
    assert ssh_keys_problem(["1"] * 3, 2, key, "a key id") == "sshKeys has 3 keys; at most 2"
    assert ssh_keys_problem(["1", "me"], 2, key, "a key id") == "sshKeys: 'me' is not a key id"


def test_a_token_api_checks_the_token_file_then_the_endpoint() -> None:
    def problem(token_file: str, endpoint: str) -> str:
        return token_api_problem(token_file, endpoint, example="/run/t", variable="T")

    assert problem("", "") == ""
    assert problem("/run/t", "http://127.0.0.1:1") == ""
    assert problem("t", "http://example.com").startswith("tokenFile 't'")
    assert problem("/run/t", "http://example.com").startswith("endpointUrl 'http://example.com'")


def test_a_long_value_is_shown_cut_short() -> None:
    assert shown("abc") == "'abc'"
    long = shown("x" * 5000)
    assert long.endswith("... (5000 characters)")
    assert len(long) < 120


@pytest.mark.parametrize("path", ["", "/var/run/secrets/token"])
def test_a_token_file_may_be_absent_or_absolute(path: str) -> None:
    assert token_file_problem(path, "/run/secrets/t", "CLOUD_TOKEN") == ""


@pytest.mark.parametrize("path", ["token.txt", "./token", "/run/secrets/t\0x", "~/token"])
def test_a_token_file_must_be_an_absolute_path(path: str) -> None:
    problem = token_file_problem(path, "/run/secrets/t", "CLOUD_TOKEN")
    assert problem.startswith(f"tokenFile {path!r}: use an absolute path, e.g. /run/secrets/t")
    assert problem.endswith("leave it out to use CLOUD_TOKEN")


@pytest.mark.parametrize(
    "endpoint",
    [
        "",
        "https://api.example.com",
        "http://127.0.0.1:8089",
        "http://127.5.6.7",
        "http://localhost:8089",
        "HTTP://LOCALHOST:8089",
        "http://localhost.localdomain",
        "http://[::1]:8089/",
    ],
)
def test_plain_http_is_fine_to_this_machine_only(endpoint: str) -> None:
    assert plain_http_problem(endpoint) == ""


@pytest.mark.parametrize(
    "endpoint",
    ["http://api.example.com", "HTTP://api.example.com", "http://10.0.0.5:8080", "http://[::2]"],
)
def test_plain_http_across_a_network_is_refused(endpoint: str) -> None:
    problem = plain_http_problem(endpoint)
    assert problem.startswith(f"endpointUrl {endpoint!r}: plain http would send the API token")
    assert "use https" in problem


def test_loopback_hosts() -> None:
    assert all(map(loopback_host, ["localhost", "LocalHost", "127.0.0.1", "::1"]))
    assert not any(map(loopback_host, ["", "example.com", "10.0.0.1", "localhost.example.com"]))


# ----------------------------------------------------------------------------- firewall leftovers

WHEN = datetime(2024, 5, 1, tzinfo=UTC)


def test_firewall_leftovers_are_owned_by_the_entry_and_of_the_firewall_kind() -> None:
    got = firewall_leftovers("do-ams", [("firewalls/a", WHEN), ("firewalls/b", WHEN)])
    assert got == [
        Leftover("firewalls/a", "firewall:do-ams", WHEN, FIREWALL_KIND),
        Leftover("firewalls/b", "firewall:do-ams", WHEN, FIREWALL_KIND),
    ]
    assert firewall_leftovers("do-ams", []) == []


def _numeric(value: str) -> int | None:
    head, _, tail = value.partition("/")
    return int(tail) if head == "firewalls" and tail.isdigit() else None


def test_a_reported_firewall_leftover_gives_back_its_id() -> None:
    (leftover,) = firewall_leftovers("hz-eu", [("firewalls/7", WHEN)])
    assert firewall_id_of("hz-eu", leftover, _numeric, "firewalls/<id>") == 7


@pytest.mark.parametrize(
    ("provider_id", "kind"),
    [("firewalls/7", "volume"), ("firewalls/x", FIREWALL_KIND), ("servers/7", FIREWALL_KIND)],
)
def test_anything_else_is_permanent_naming_the_form(provider_id: str, kind: str) -> None:
    leftover = Leftover(provider_id, "firewall:hz-eu", WHEN, kind)
    with pytest.raises(Permanent, match=r"hz-eu: .* is not a leftover this provider reports") as e:
        firewall_id_of("hz-eu", leftover, _numeric, "firewalls/<id>")
    assert "firewalls/<id>" in str(e.value)
    assert repr(provider_id) in str(e.value)
