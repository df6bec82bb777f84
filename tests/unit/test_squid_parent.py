"""A Squid chained to a parent (D160): the ``cache_peer`` line, its login escaped so that any
password reaches the service as written and never splits, comments or expands Squid's line, and
the hosts and user names Squid would misread refused."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.providers.pure.squidconf import (
    Parent,
    parent_host,
    parent_lines,
    peer_login,
    squid_config,
)


def test_a_parent_takes_every_request() -> None:
    lines = parent_lines(Parent("gate.example.net", 7000, "customer-acme-sessid-abc", "pw"))
    assert lines == [
        "cache_peer gate.example.net parent 7000 0 no-query no-digest no-netdb-exchange "
        "default name=egress_upstream login=customer-acme-sessid-abc:pw",
        "never_direct allow all",
    ]


def test_the_config_chains_only_with_a_parent() -> None:
    common = {"listen": "127.0.0.1:20001", "name": "x", "cache_log": "c", "coredump_dir": "d"}
    plain = squid_config(**common)  # type: ignore[arg-type]
    assert "cache_peer" not in plain
    assert "never_direct" not in plain
    chained = squid_config(**common, parent=Parent("192.0.2.7", 7000, "u", "p"))  # type: ignore[arg-type]
    assert "cache_peer 192.0.2.7 parent 7000 " in chained
    assert "\nnever_direct allow all\n" in chained


@pytest.mark.parametrize(
    ("password", "escaped"),
    [
        ("p w", "p%20w"),
        ("100%", "100%25"),
        ("a#b", "a%23b"),
        ("${service_name}", "%24%7Bservice_name%7D"),
        ("x:y@z", "x%3Ay%40z"),
        ("ünï", "%C3%BCn%C3%AF"),
    ],
)
def test_the_password_is_escaped(password: str, escaped: str) -> None:
    assert peer_login("user", password) == f"user:{escaped}"


@given(
    password=st.text(
        st.characters(min_codepoint=0x20, exclude_characters="\x7f", exclude_categories=["Cs"]),
        max_size=80,
    )
)
def test_any_password_round_trips_as_one_word(password: str) -> None:
    login = peer_login("customer-acme", password)
    assert not any(c.isspace() or c in "#$\"'\\" for c in login)
    user, _, escaped = login.partition(":")
    assert (unquote(user), unquote(escaped)) == ("customer-acme", password)


@pytest.mark.parametrize(
    ("username", "password"),
    [
        ("a", "p\ud800"),  # bytes no UTF-8 decoder made (an environment variable's)
        ("", "p"),
        ("a:b", "p"),
        ("*", "p"),
        ("*:x", "p"),
        ("a\nb", "p"),
        ("a", "p\r\nX: y"),
        ("a", "p\x00"),
    ],
)
def test_a_login_squid_would_misread_is_refused(username: str, password: str) -> None:
    with pytest.raises(ValueError, match=r"user name|control characters|UTF-8 text"):
        peer_login(username, password)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("gate.example.net", "gate.example.net"),
        ("GATE.example.net.", "GATE.example.net."),
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8::7", "2001:db8::7"),
        ("2001:DB8:0::7", "2001:db8::7"),
    ],
)
def test_hosts_squid_takes(host: str, expected: str) -> None:
    assert parent_host(host) == expected


@pytest.mark.parametrize(
    "host",
    [
        "",
        "gate example",
        "gate.net login=x",
        "-gate.net",
        "gate-.net",
        "a..b",
        "[::1]",
        "a" * 64,
        "ho#st",
    ],
)
def test_hosts_that_would_be_another_word_are_refused(host: str) -> None:
    with pytest.raises(ValueError, match="is not a host name or an IP address"):
        parent_host(host)


def test_a_port_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="parent port 0 is not a port"):
        parent_lines(Parent("gate.net", 0, "u", "p"))


def test_the_login_is_not_in_a_parents_repr() -> None:
    assert "hunter2" not in repr(Parent("gate.net", 7000, "customer-x", "hunter2"))
