"""The ``hetzner:`` block of the providers config: every mistake stops start-up naming the entry,
the field and the fix; the token is never a field and never echoed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from events.proxyresource import from_object, validate
from services.providers.config import build_providers, parse_providers_config
from services.providers.hetzner.config import DEFAULT_ENDPOINT, HetznerConfig
from services.providers.hetzner.provider import HetznerProvider
from services.runtime.settings.errors import ConfigError

EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "providers-hetzner.yaml"
CLIENTS = ["203.0.113.0/24"]


def parse(block: object, name: str = "hz-eu") -> Any:
    raw = {"providers": [{"name": name, "type": "hetzner", "auth": "none", "hetzner": block}]}
    (entry,) = parse_providers_config(
        raw, source="providers.yaml", base_dir=Path("/cfg"), default_data_dir=Path("/data")
    )
    return entry


def test_a_minimal_block_gets_the_documented_defaults() -> None:
    config: HetznerConfig = parse({"allowedClients": CLIENTS}).config
    assert config == HetznerConfig(allowed_clients=tuple(CLIENTS))
    assert config.locations == ("fsn1", "nbg1", "hel1")
    assert (config.server_type, config.image) == ("cx23", "debian-12")
    assert (config.network, config.ssh_keys, config.ipv6, config.token_file) == (0, (), False, "")
    assert (config.proxy_port, config.timeout_seconds, config.install_squid) == (3128, 30.0, True)
    assert config.api_endpoint == f"{DEFAULT_ENDPOINT}/v1"


def test_camel_case_fields_are_read() -> None:
    config: HetznerConfig = parse(
        {
            "allowedClients": ["198.51.100.0/24", "2001:db8::/32"],
            "proxyPort": 8080,
            "endpointUrl": "http://127.0.0.1:8089/",
            "timeoutSeconds": 5,
            "installSquid": False,
            "locations": ["ash", "hil"],
            "serverType": "cpx22",
            "image": "114690387",
            "network": 123456,
            "sshKeys": ["ops@laptop", "4711"],
            "ipv6": True,
            "tokenFile": "/var/run/secrets/hcloud/token",
        }
    ).config
    assert config.locations == ("ash", "hil")
    assert (config.server_type, config.image, config.network) == ("cpx22", "114690387", 123456)
    assert config.ssh_keys == ("ops@laptop", "4711")
    assert config.ipv6 is True
    assert config.token_file == "/var/run/secrets/hcloud/token"
    assert config.api_endpoint == "http://127.0.0.1:8089/v1"


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({}, "hetzner: allowedClients is required"),
        (None, "hetzner: allowedClients is required"),
        ({"allowedClients": ["crawlers"]}, "'crawlers' is not a CIDR"),
        ({"allowedClients": "203.0.113.0/24"}, "hetzner.allowedClients: Expected `array`"),
        ({"allowedClients": [f"10.{i}.0.0/16" for i in range(61)]}, "merge them"),
        ({"allowedClients": CLIENTS, "proxyPort": 0}, "hetzner.proxyPort"),
        ({"allowedClients": CLIENTS, "proxyPort": "3128"}, "hetzner.proxyPort: Expected `int`"),
        ({"allowedClients": CLIENTS, "timeoutSeconds": 0}, "hetzner.timeoutSeconds"),
        ({"allowedClients": CLIENTS, "timeoutSeconds": 601}, "hetzner.timeoutSeconds"),
        ({"allowedClients": CLIENTS, "locations": []}, "locations is empty"),
        ({"allowedClients": CLIENTS, "locations": "fsn1"}, "hetzner.locations: Expected `array`"),
        ({"allowedClients": CLIENTS, "locations": ["FSN1"]}, "locations: 'FSN1' is not"),
        ({"allowedClients": CLIENTS, "locations": ["fsn 1"]}, "'fsn 1' is not a Hetzner location"),
        ({"allowedClients": CLIENTS, "locations": ["fsn1", "fsn1"]}, "a location twice"),
        ({"allowedClients": CLIENTS, "locations": ["a1"] * 33}, "has 33 entries"),
        ({"allowedClients": CLIENTS, "locations": [1]}, "hetzner.locations[0]: Expected `str`"),
        ({"allowedClients": CLIENTS, "serverType": ""}, "serverType '' is not"),
        ({"allowedClients": CLIENTS, "serverType": "CX 22"}, "serverType 'CX 22'"),
        ({"allowedClients": CLIENTS, "image": ""}, "image ''"),
        ({"allowedClients": CLIENTS, "image": "../etc"}, "image '../etc'"),
        ({"allowedClients": CLIENTS, "network": -1}, "hetzner.network: Expected `int` >= 0"),
        ({"allowedClients": CLIENTS, "network": "default"}, "hetzner.network: Expected `int`"),
        ({"allowedClients": CLIENTS, "sshKeys": [""]}, "sshKeys: '' is not"),
        ({"allowedClients": CLIENTS, "sshKeys": ["a\nb"]}, "sshKeys: 'a\\nb' is not"),
        ({"allowedClients": CLIENTS, "sshKeys": ["k"] * 33}, "sshKeys has 33 keys"),
        ({"allowedClients": CLIENTS, "ipv6": "yes"}, "hetzner.ipv6: Expected `bool`"),
        ({"allowedClients": CLIENTS, "tokenFile": "token.txt"}, "tokenFile 'token.txt'"),
        ({"allowedClients": CLIENTS, "tokenFile": 5}, "hetzner.tokenFile: Expected `str`"),
        ({"allowedClients": CLIENTS, "endpointUrl": "ftp://x"}, "endpointUrl 'ftp://x'"),
        (
            {"allowedClients": CLIENTS, "endpointUrl": "https://api.hetzner.cloud/v1"},
            "(no path)",
        ),
        (
            {"allowedClients": CLIENTS, "endpointUrl": "http://api.example.com"},
            "plain http would send the API token unencrypted",
        ),
        ({"allowedClients": CLIENTS, "apiEndpoint": "x"}, "unknown field `apiEndpoint`"),
        ({"allowedClients": CLIENTS, "location": "fsn1"}, "unknown field `location`"),
        ([1, 2], "hetzner: Expected `object`"),
    ],
)
def test_each_mistake_names_the_entry_the_field_and_the_fix(block: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(block)
    assert "providers[0] (hz-eu)" in str(caught.value)
    assert message in str(caught.value)


def test_a_token_written_into_the_config_is_refused_without_being_echoed() -> None:
    secret = "hcloud-9f8e7d6c5b4a39281706f5e4d3c2b1a0"
    for key in ("token", "apiToken", "hcloudToken"):
        with pytest.raises(ConfigError) as caught:
            parse({"allowedClients": CLIENTS, key: secret})
        assert f"unknown field `{key}`" in str(caught.value)
        assert secret not in str(caught.value)


def test_loopback_endpoints_may_be_plain_http() -> None:
    for endpoint in (
        "http://127.0.0.1:1",
        "http://127.9.9.9",
        "http://[::1]:80",
        "http://localhost",
    ):
        assert parse({"allowedClients": CLIENTS, "endpointUrl": endpoint}).config.endpoint_url


@pytest.mark.parametrize("name", ["hz-", "_hz", "-x"])
def test_an_entry_name_that_cannot_be_a_label_value_stops_start_up(name: str) -> None:
    raw = {
        "providers": [
            {
                "name": name,
                "type": "hetzner",
                "auth": "none",
                "hetzner": {"allowedClients": CLIENTS},
            }
        ]
    }
    entries = parse_providers_config(
        raw, source="p.yaml", base_dir=Path("/cfg"), default_data_dir=Path("/data")
    )
    with pytest.raises(ConfigError, match=rf"providers\[0\] \({name}\): the name"):
        build_providers(entries)


def test_the_provider_is_built_without_io_and_shows_no_settings() -> None:
    entry = parse({"allowedClients": CLIENTS, "tokenFile": "/nonexistent/token"})
    (provider,) = build_providers([entry]).values()
    assert isinstance(provider, HetznerProvider)
    assert repr(provider) == "HetznerProvider('hz-eu')"


def test_the_shipped_example_parses_into_two_named_instances_of_one_type() -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    entries = parse_providers_config(
        raw, source=str(EXAMPLE), base_dir=EXAMPLE.parent, default_data_dir=Path("/data")
    )
    assert [(e.name, e.type) for e in entries] == [
        ("hetzner-eu", "hetzner"),
        ("hetzner-us", "hetzner"),
    ]
    eu, us = (entry.config for entry in entries)
    assert isinstance(eu, HetznerConfig)
    assert isinstance(us, HetznerConfig)
    assert set(eu.locations).isdisjoint(us.locations)
    assert not eu.token_file
    assert us.token_file.startswith("/")


def test_the_shipped_sample_proxy_is_a_valid_proxy_on_hetzner_eu() -> None:
    documents = list(yaml.safe_load_all((EXAMPLE.parent / "hetzner-proxy.yaml").read_text()))
    proxy = from_object(next(doc for doc in documents if doc["kind"] == "Proxy"))
    assert validate(proxy) == []
    assert proxy.spec.provider == "hetzner-eu"
    assert proxy.spec.placement.zone == "fsn1"
