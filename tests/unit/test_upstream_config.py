"""The ``upstream:`` block of ``--providers-config`` (D160): what loads, what is built, and the
message every mistake gets, through the same parser ``up`` and the executor use. The account's
password is read when the provider is built, from a file or a variable, and never shown."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from services.providers.config import (
    LEASE_TYPES,
    ProviderEntry,
    build_unwrapped,
    parse_providers_config,
)
from services.providers.upstream.config import UpstreamConfig
from services.providers.upstream.provider import UpstreamProvider
from services.providers.upstream.pure.templates import NAMED
from services.runtime.settings.errors import ConfigError

PASSWORD = "hunter2-very_secret"


def parse(tmp_path: Path, block: str) -> list[ProviderEntry]:
    text = "providers:\n  - name: resi-de\n    type: upstream\n    upstream:\n" + textwrap.indent(
        textwrap.dedent(block), "      "
    )
    return parse_providers_config(
        yaml.safe_load(text),
        source="providers.yaml",
        base_dir=tmp_path,
        default_data_dir=tmp_path / "data",
    )


def password_file(tmp_path: Path, content: bytes = PASSWORD.encode() + b"\n") -> Path:
    path = tmp_path / "resi-password"
    path.write_bytes(content)
    return path


def test_the_issues_example_loads_and_builds(tmp_path: Path) -> None:
    secret = password_file(tmp_path)
    [entry] = parse(
        tmp_path,
        f"""
        endpoint: gate.example-proxies.net:7000
        username: "customer-{{account}}-country-{{country}}-session-{{session}}-sesstime-30"
        account: acme
        passwordFile: {secret}
        sessionSeconds: 1800
        allowedCountries: [de, fr]
        """,
    )
    assert entry.enforces_leases
    assert "upstream" in LEASE_TYPES
    config = entry.config
    assert isinstance(config, UpstreamConfig)
    assert config.template == "generic"
    assert config.data_dir == str(tmp_path / "data" / "resi-de")
    assert config.host_port == ("gate.example-proxies.net", 7000)
    provider = build_unwrapped(entry)
    assert isinstance(provider, UpstreamProvider)
    assert (provider.type, provider.endpoint) == ("upstream", ("gate.example-proxies.net", 7000))
    assert provider.allowed_countries == ("de", "fr")
    assert provider.session_seconds == 1800
    assert PASSWORD not in repr(provider)
    assert PASSWORD not in repr(config)


@pytest.mark.parametrize("template", sorted(NAMED))
def test_each_named_template_loads(
    tmp_path: Path, template: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESI_PASSWORD", PASSWORD)
    [entry] = parse(
        tmp_path,
        f"""
        endpoint: "[2001:db8::7]:7000"
        template: {template}
        account: acme
        zone: resi1
        passwordEnv: RESI_PASSWORD
        allowedCountries: [de]
        maxBytesPerDay: 5000000000
        """,
    )
    assert isinstance(entry.config, UpstreamConfig)
    assert entry.config.max_bytes_per_day == 5_000_000_000
    assert entry.config.host_port == ("2001:db8::7", 7000)
    provider = build_unwrapped(entry)
    assert isinstance(provider, UpstreamProvider)
    assert provider.templates == NAMED[template]


BASE = {
    "endpoint": "gate.example.net:7000",
    "template": "oxylabs",
    "account": "acme",
    "passwordEnv": "RESI_PASSWORD",
    "allowedCountries": "[de]",
}


def block(**changes: str | None) -> str:
    fields = {**BASE, **changes}
    return "".join(f"{k}: {v}\n" for k, v in fields.items() if v is not None)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"endpoint": None}, r"missing required field `endpoint`"),
        ({"endpoint": "gate.example.net"}, r"endpoint 'gate.example.net' is not host:port"),
        ({"endpoint": "gate.example.net:0"}, r"is not host:port"),
        ({"endpoint": "gate.example.net:70000"}, r"is not host:port"),
        ({"endpoint": '"gate example:7000"'}, r"endpoint: 'gate example' is not a host name"),
        ({"endpoint": '"gate.net:7000 login=x"'}, r"is not host:port"),
        ({"endpoint": '"2001:db8::1:7000"'}, r"an IPv6 address goes in brackets"),
        ({"endpoint": '"-bad.example:7000"'}, r"is not a host name"),
        ({"template": "luminati"}, r"template 'luminati' is not known; use one of brightdata"),
        (
            {"username": '"u-{session}"'},
            r"username and password templates are for template generic",
        ),
        ({"template": "generic"}, r"template generic needs username"),
        (
            {"template": "generic", "username": '"c-{account}-{country}"'},
            r"username has no \{session\}",
        ),
        (
            {"template": "generic", "username": '"c-{acount}-{session}"'},
            r"username: \{acount\} is not a placeholder",
        ),
        (
            {"template": "generic", "username": '"c-{session}"', "password": '"{pass}"'},
            r"password: \{pass\} is not a placeholder",
        ),
        ({"account": None}, r"account is empty, and the template uses \{account\}"),
        ({"account": '"ac-me x"'}, r"account 'ac-me x': use letters, digits"),
        ({"template": "brightdata"}, r"zone is empty, and the template uses \{zone\}"),
        ({"passwordEnv": None}, r"give exactly one of passwordFile .* neither is set"),
        ({"passwordFile": "/x"}, r"give exactly one of passwordFile .* both are set"),
        ({"passwordEnv": '"RESI PASSWORD"'}, r"passwordEnv 'RESI PASSWORD' is not a variable"),
        ({"allowedCountries": None}, r"allowedCountries is empty"),
        ({"allowedCountries": "[]"}, r"allowedCountries is empty"),
        ({"allowedCountries": "[DE]"}, r"allowedCountries\[0\] 'DE' is not an ISO 3166-1"),
        ({"allowedCountries": "[de, deu]"}, r"allowedCountries\[1\] 'deu'"),
        ({"allowedCountries": "de"}, r"Expected `array`, got `str`"),
        ({"sessionSeconds": "30"}, r"upstream\.sessionSeconds: Expected `int` >= 60"),
        ({"sessionSeconds": "864000"}, r"Expected `int` <= 86400"),
        ({"maxBytesPerDay": "0"}, r"upstream\.maxBytesPerDay: Expected `int` >= 1"),
        ({"maxBytesPerDay": "-5"}, r"Expected `int` >= 1"),
        ({"portRange": '"30000-20000"'}, r"portRange '30000-20000'"),
        ({"password": '"{password}"'}, r"are for template generic"),
        ({"apiKey": "x"}, r"unknown field `apiKey`"),
        ({"probeTarget": "example.com"}, r"probeTarget 'example.com' is not host:port; write a"),
        ({"probeTarget": '"a b:443"'}, r"probeTarget: 'a b' is not a host name"),
    ],
)
def test_mistakes_name_the_entry_the_field_and_the_fix(
    tmp_path: Path, changes: dict[str, str | None], says: str
) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        parse(tmp_path, block(**changes))
    assert r"providers[0] (resi-de)" in str(caught.value)


def entry(tmp_path: Path, **changes: str | None) -> ProviderEntry:
    [found] = parse(tmp_path, block(**changes))
    return found


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", r"holds no password"),
        (b"\n", r"holds no password"),
        (b"two\nlines\n", r"control character or a line break"),
        (b"tab\there", r"control character"),
        (b"\xff\xfe", r"not UTF-8 text"),
        (b"x" * 5000, r"larger than any password"),
    ],
)
def test_a_bad_password_file_is_refused_without_showing_it(
    tmp_path: Path, content: bytes, says: str
) -> None:
    path = password_file(tmp_path, content)
    found = entry(tmp_path, passwordEnv=None, passwordFile=str(path))
    with pytest.raises(ConfigError, match=says) as caught:
        build_unwrapped(found)
    assert f"passwordFile {path}" in str(caught.value)
    assert "resi-de" in str(caught.value)
    if content.strip():
        assert content.decode("utf-8", "replace")[:8] not in str(caught.value)


def test_a_missing_password_file_names_it(tmp_path: Path) -> None:
    found = entry(tmp_path, passwordEnv=None, passwordFile=str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match=r"absent: cannot read it \(No such file"):
        build_unwrapped(found)


def test_a_variable_holding_bytes_that_are_no_utf8_is_refused_without_showing_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESI_PASSWORD", b"secret\xff".decode("utf-8", "surrogateescape"))
    with pytest.raises(ConfigError, match=r"passwordEnv RESI_PASSWORD: not UTF-8 text") as caught:
        build_unwrapped(entry(tmp_path))
    assert "secret" not in str(caught.value)


def test_an_unset_or_empty_variable_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RESI_PASSWORD", raising=False)
    with pytest.raises(ConfigError, match=r"passwordEnv RESI_PASSWORD holds no password"):
        build_unwrapped(entry(tmp_path))
    monkeypatch.setenv("RESI_PASSWORD", "")
    with pytest.raises(ConfigError, match=r"passwordEnv RESI_PASSWORD holds no password"):
        build_unwrapped(entry(tmp_path))


def test_the_file_is_read_whole_bar_one_trailing_newline(tmp_path: Path) -> None:
    path = password_file(tmp_path, b" spaced pass \r\n")
    provider = build_unwrapped(entry(tmp_path, passwordEnv=None, passwordFile=str(path)))
    assert isinstance(provider, UpstreamProvider)
    assert provider._password == " spaced pass "


EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "providers-upstream.yaml"


def test_the_example_loads(tmp_path: Path) -> None:
    entries = parse_providers_config(
        yaml.safe_load(EXAMPLE.read_text()),
        source=str(EXAMPLE),
        base_dir=tmp_path,
        default_data_dir=tmp_path,
    )
    assert [(e.name, e.type) for e in entries] == [("resi-de", "upstream"), ("isp-us", "upstream")]
    templates = [e.config.templates for e in entries if isinstance(e.config, UpstreamConfig)]
    assert templates[1] == NAMED["brightdata"]
    assert "session" in templates[0].placeholders


def test_without_squid_the_entry_says_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESI_PASSWORD", PASSWORD)
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without squid
    with pytest.raises(ConfigError, match=r"resi-de.*`squid` is not on PATH; install Squid"):
        build_unwrapped(entry(tmp_path))
