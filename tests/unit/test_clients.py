"""The clients file: strict parsing with the field and the fix named, and what a client may do."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from services.cli.main import main
from services.runtime.pure.clients import (
    ADMIN,
    DEFAULT_CLIENT,
    LEASE,
    READ,
    Client,
    ClientsError,
    hash_token,
    parse_clients,
)
from services.runtime.pure.throttle import LoginThrottle

A = hash_token("token-a" * 6)
B = hash_token("token-b" * 6)


def _file(*entries: str) -> str:
    return "clients:\n" + "".join(entries)


def _entry(name: str, token: str, extra: str = "", scopes: str = "[lease, read]") -> str:
    return f"  - name: {name}\n    token: {token}\n    scopes: {scopes}\n{extra}"


def test_a_file_names_each_client_with_its_scopes_and_limits() -> None:
    table = parse_clients(
        _file(
            _entry("crawler-a", A, "    maxLeases: 2\n    selectors:\n      - {country: de}\n"),
            _entry("ops", B, scopes="[admin]"),
        ),
        "clients.yaml",
    )
    assert table.names == ["crawler-a", "ops"]
    crawler = table.identify("token-a" * 6)
    assert crawler is not None
    assert crawler.name == "crawler-a"
    assert crawler.max_leases == 2
    assert crawler.may(LEASE)
    assert crawler.may(READ)
    assert not crawler.may(ADMIN)
    assert crawler.allows_selector({"country": "de", "city": "berlin"})
    assert not crawler.allows_selector({"country": "fr"})
    assert not crawler.allows_selector({})
    assert crawler.owns("crawler-a")
    assert not crawler.owns("ops")
    assert not crawler.owns("")
    ops = table.identify("token-b" * 6)
    assert ops is not None
    assert ops.admin
    assert ops.owns("crawler-a")
    assert table.identify("token-c" * 6) is None
    assert table.identify("") is None


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "expected a mapping"),
        ("clients: []", "non-empty list"),
        ("clients: {a: 1}", "non-empty list"),
        ("client: []", "one key, `clients`"),
        ("clients: [1]", "clients[0]: a mapping"),
        (_file(_entry("Crawler", A)), "clients[0].name"),
        (_file(_entry("a" * 64, A)), "clients[0].name"),
        (_file(_entry("ok", "plaintext-token")), "clients[0].token"),
        (_file(_entry("ok", "sha256:" + "A" * 64)), "clients[0].token"),
        (_file(_entry("ok", A, scopes="[write]")), "clients[0].scopes"),
        (_file(_entry("ok", A, scopes="[]")), "clients[0].scopes"),
        (_file(_entry("ok", A, "    maxLeases: 0\n")), "clients[0].maxLeases"),
        (_file(_entry("ok", A, "    maxLeases: true\n")), "clients[0].maxLeases"),
        (_file(_entry("ok", A, "    maxLeases: 2.5\n")), "clients[0].maxLeases"),
        (_file(_entry("ok", A, "    maxLeases: 1e99\n")), "clients[0].maxLeases"),
        (_file(_entry("ok", A, "    selectors: [{}]\n")), "clients[0].selectors[0]"),
        (_file(_entry("ok", A, "    selectors: [{country: no}]\n")), "quote numbers and booleans"),
        (_file(_entry("ok", A, "    selector: []\n")), "did you mean 'selectors'"),
        (_file(_entry("ok", A), _entry("ok", B)), "clients[1].name: 'ok' is named twice"),
        (_file(_entry("a", A), _entry("b", A)), "clients[1].token: the same token as client 'a'"),
        ("clients: [&x [*x]]", "clients[0]"),
        ("{{{", "not YAML"),
    ],
)
def test_a_file_it_cannot_use_is_refused_naming_the_field(text: str, named: str) -> None:
    with pytest.raises(ClientsError) as refused:
        parse_clients(text, "clients.yaml")
    assert named in str(refused.value)
    assert "clients.yaml" in str(refused.value)


def test_a_token_pasted_instead_of_its_hash_is_not_quoted_back() -> None:
    secret = "s3cr3t-" * 8
    with pytest.raises(ClientsError) as refused:
        parse_clients(_file(_entry("ok", secret)), "f")
    assert secret not in str(refused.value)
    assert "egress-proxies clients hash" in str(refused.value)


def test_the_token_client_is_one_more_admin_and_names_do_not_clash() -> None:
    table = parse_clients(_file(_entry("crawler-a", A)), "f").with_default("admin-token-" * 3)
    default = table.identify("admin-token-" * 3)
    assert default is not None
    assert default.name == DEFAULT_CLIENT
    assert default.admin
    with pytest.raises(ClientsError, match="named 'default'"):
        parse_clients(_file(_entry("default", A)), "f").with_default("x" * 40)
    with pytest.raises(ClientsError, match="DISCOVERY_TOKEN's token"):
        parse_clients(_file(_entry("crawler-a", A)), "f").with_default("token-a" * 6)


@given(st.binary(max_size=2048))
def test_any_bytes_parse_or_are_refused_never_crash(raw: bytes) -> None:
    with contextlib.suppress(ClientsError):
        parse_clients(raw, "f")


def test_failed_logins_are_slowed_to_the_rate_per_address() -> None:
    throttle = LoginThrottle(per_minute=5)
    for _ in range(5):
        assert throttle.retry_after("10.0.0.1", 100.0) == 0
        throttle.failed("10.0.0.1", 100.0)
    assert throttle.retry_after("10.0.0.1", 100.0) == pytest.approx(12.0)
    assert throttle.retry_after("10.0.0.2", 100.0) == 0  # another address is not slowed
    assert throttle.retry_after("10.0.0.1", 112.0) == 0  # one more try after 60 s / 5


def test_the_addresses_it_remembers_are_bounded() -> None:
    throttle = LoginThrottle(per_minute=1, max_addresses=3)
    for index in range(10):
        throttle.failed(f"10.0.0.{index}", 0.0)
    assert len(throttle._buckets) == 3
    assert throttle.retry_after("10.0.0.9", 0.0) > 0


def test_a_client_without_selectors_may_use_any() -> None:
    client = Client("c", frozenset({LEASE}))
    assert client.allows_selector({})
    assert client.allows_selector({"country": "de"})
    assert not client.may(READ)


def test_the_cli_hashes_a_token_and_checks_a_file(tmp_path: Path) -> None:
    token = "t" * 40
    hashed = CliRunner().invoke(main, ["clients", "hash"], input=token + "\n")
    assert hashed.exit_code == 0, hashed.output
    assert hashed.output.strip() == hash_token(token)
    short = CliRunner().invoke(main, ["clients", "hash"], input="short\n")
    assert short.exit_code == 2
    assert "at least 32 characters" in short.output
    good = tmp_path / "good.yaml"
    good.write_text(_file(_entry("crawler-a", hashed.output.strip(), "    maxLeases: 3\n")))
    listed = CliRunner().invoke(main, ["clients", "check", str(good)])
    assert listed.exit_code == 0, listed.output
    assert "crawler-a" in listed.output
    assert "lease,read" in listed.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(_file(_entry("crawler-a", token)))
    refused = CliRunner().invoke(main, ["clients", "check", str(bad)])
    assert refused.exit_code == 2
    assert "clients[0].token" in refused.output
    assert token not in refused.output
