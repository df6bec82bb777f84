"""The ``digitalocean:`` block of the providers config: every mistake stops start-up naming the
entry, the field and the fix; the token comes from the environment or a file, never the block."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from events.proxyresource import from_object, validate
from services.providers.config import ProviderEntry, build_providers, parse_providers_config
from services.providers.digitalocean.config import DigitalOceanConfig
from services.providers.digitalocean.provider import DigitalOceanProvider
from services.runtime.settings.errors import ConfigError

EXAMPLES = Path(__file__).parents[2] / "deploy" / "examples"
CLIENTS = ["203.0.113.0/24"]


def parse(block: object, name: str = "do-ams") -> ProviderEntry:
    raw = {"providers": [{"name": name, "type": "digitalocean", "digitalocean": block}]}
    (entry,) = parse_providers_config(
        raw, source="providers.yaml", base_dir=Path("/cfg"), default_data_dir=Path("/data")
    )
    return entry


def with_clients(**fields: Any) -> dict[str, Any]:
    return {"allowedClients": CLIENTS, **fields}


def test_a_minimal_block_gets_the_documented_defaults() -> None:
    config = parse(with_clients()).config
    assert isinstance(config, DigitalOceanConfig)
    assert config.regions == ("ams3",)
    assert (config.size, config.image) == ("s-1vcpu-1gb", "debian-12-x64")
    assert (config.vpc_uuid, config.ssh_keys, config.token_file, config.ipv6) == ("", (), "", False)
    assert (config.proxy_port, config.timeout_seconds, config.install_squid) == (3128, 30.0, True)
    assert config.endpoint_url == ""


def test_camel_case_fields_are_read() -> None:
    config = parse(
        with_clients(
            regions=["fra1", "ams3"],
            size="s-1vcpu-1gb",
            image="123456",
            vpcUuid="5a4981aa-9653-4bd1-bef5-d6bff52042e4",
            sshKeys=["289794", "3b:16:bf:e4:8b:00:8b:b8:59:8c:a9:d3:f0:19:45:fa"],
            tokenFile="/var/run/secrets/do/token",
            ipv6=True,
            proxyPort=8888,
            endpointUrl="http://127.0.0.1:8089",
            timeoutSeconds=5,
            installSquid=False,
        )
    ).config
    assert isinstance(config, DigitalOceanConfig)
    assert config.regions == ("fra1", "ams3")
    assert config.vpc_uuid == "5a4981aa-9653-4bd1-bef5-d6bff52042e4"
    assert config.ssh_keys[1].startswith("3b:16")
    assert (config.token_file, config.ipv6, config.proxy_port) == (
        "/var/run/secrets/do/token",
        True,
        8888,
    )
    assert (config.endpoint_url, config.timeout_seconds, config.install_squid) == (
        "http://127.0.0.1:8089",
        5.0,
        False,
    )


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({}, "allowedClients is required"),
        (None, "allowedClients is required"),
        ({"allowedClients": "203.0.113.0/24"}, "digitalocean.allowedClients: Expected `array`"),
        ({"allowedClients": ["crawlers"]}, "'crawlers' is not a CIDR"),
        ({"allowedClients": ["203.0.113.1/24"]}, "'203.0.113.1/24' is not a CIDR"),
        ({"allowedClients": [f"10.0.{i}.0/24" for i in range(61)]}, "merge them"),
        ({"allowedClients": [None]}, "digitalocean.allowedClients[0]: Expected `str`"),
        (with_clients(token="dop_v1_abc"), "unknown field `token`"),
        (with_clients(apiToken="dop_v1_abc"), "unknown field `apiToken`"),
        (with_clients(region="ams3"), "unknown field `region`"),
        (with_clients(regions=[]), "regions is empty"),
        (with_clients(regions="ams3"), "digitalocean.regions: Expected `array`"),
        (with_clients(regions=["Amsterdam 3"]), "regions: 'Amsterdam 3' is not a region slug"),
        (with_clients(regions=["ams3", "ams3"]), "lists a region twice"),
        (with_clients(regions=[f"ams{i}" for i in range(17)]), "at most 16"),
        (with_clients(size=""), "size '': use a size slug"),
        (with_clients(size="1 GB"), "size '1 GB'"),
        (with_clients(size=1), "digitalocean.size: Expected `str`"),
        (with_clients(size="x" * 100_000), "... (100000 characters)"),
        (with_clients(image="Debian 12"), "image 'Debian 12'"),
        (with_clients(image=""), "image ''"),
        (with_clients(vpcUuid="default"), "vpcUuid 'default'"),
        (with_clients(sshKeys=["ssh-ed25519 AAAA me@x"]), "sshKeys: 'ssh-ed25519 AAAA me@x'"),
        (with_clients(sshKeys=[str(i + 1) for i in range(21)]), "at most 20"),
        (with_clients(tokenFile="token.txt"), "tokenFile 'token.txt': use an absolute path"),
        (with_clients(ipv6="yes"), "digitalocean.ipv6: Expected `bool`"),
        (with_clients(proxyPort=0), "digitalocean.proxyPort: Expected `int` >= 1"),
        (with_clients(proxyPort=70000), "digitalocean.proxyPort: Expected `int` <= 65535"),
        (with_clients(timeoutSeconds=0), "digitalocean.timeoutSeconds"),
        (with_clients(endpointUrl="api.digitalocean.com"), "endpointUrl 'api.digitalocean.com'"),
        (with_clients(endpointUrl="https://api.digitalocean.com/v2"), "(no path)"),
        (
            with_clients(endpointUrl="http://api.example.com"),
            "would send the API token unencrypted",
        ),
        (with_clients(endpointUrl="http://10.0.0.5:8080"), "use https"),
    ],
)
def test_mistakes_name_the_entry_and_the_field(block: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(block)
    text = str(caught.value)
    assert "providers[0] (do-ams)" in text
    assert message in text


@pytest.mark.parametrize(
    "endpoint", ["http://127.0.0.1:8089", "http://localhost:8089", "http://[::1]:8089", ""]
)
def test_plain_http_is_allowed_to_this_machine_only(endpoint: str) -> None:
    assert parse(with_clients(endpointUrl=endpoint)).config.endpoint_url == endpoint  # type: ignore[attr-defined]


def test_the_block_must_sit_under_its_type() -> None:
    raw = {"providers": [{"name": "do", "type": "digitalocean", "hetzner": with_clients()}]}
    with pytest.raises(ConfigError, match="exactly one settings block `digitalocean:`"):
        parse_providers_config(raw, source="p.yaml", base_dir=Path(), default_data_dir=Path())


@pytest.mark.parametrize("variable", ["DIGITALOCEAN_TOKEN", "DIGITALOCEAN_ACCESS_TOKEN"])
def test_building_reads_the_token_from_the_environment_and_does_no_io(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.delenv("DIGITALOCEAN_TOKEN", raising=False)
    monkeypatch.delenv("DIGITALOCEAN_ACCESS_TOKEN", raising=False)
    monkeypatch.setenv(variable, "dop_v1_secret_from_env")
    entry = parse(with_clients(regions=["fra1"]))
    provider = build_providers([ProviderEntry(entry.name, entry.type, entry.config, auth="none")])[
        "do-ams"
    ]
    assert isinstance(provider, DigitalOceanProvider)
    assert (provider.name, provider.type, provider.config.regions) == (
        "do-ams",
        "digitalocean",
        ("fra1",),
    )
    assert "dop_v1_secret_from_env" not in repr(provider)
    assert "dop_v1_secret_from_env" not in repr(vars(provider.api))


def test_no_token_anywhere_stops_start_up_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DIGITALOCEAN_TOKEN", raising=False)
    monkeypatch.delenv("DIGITALOCEAN_ACCESS_TOKEN", raising=False)
    entry = parse(with_clients())
    with pytest.raises(ConfigError) as caught:
        build_providers([ProviderEntry(entry.name, entry.type, entry.config, auth="none")])
    assert "providers[0] (do-ams)" in str(caught.value)
    assert "DIGITALOCEAN_TOKEN" in str(caught.value)
    assert "tokenFile" in str(caught.value)


def test_a_token_file_is_enough_at_start_up_and_is_not_read_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DIGITALOCEAN_TOKEN", raising=False)
    monkeypatch.delenv("DIGITALOCEAN_ACCESS_TOKEN", raising=False)
    entry = parse(with_clients(tokenFile="/nonexistent/do-token"))
    providers = build_providers([ProviderEntry(entry.name, entry.type, entry.config, auth="none")])
    assert isinstance(providers["do-ams"], DigitalOceanProvider)


def test_the_shipped_example_parses_into_two_entries() -> None:
    path = EXAMPLES / "providers-digitalocean.yaml"
    entries = parse_providers_config(
        yaml.safe_load(path.read_text()),
        source=str(path),
        base_dir=path.parent,
        default_data_dir=Path("/data"),
    )
    assert [(e.name, e.type) for e in entries] == [
        ("do-nl", "digitalocean"),
        ("do-de", "digitalocean"),
    ]
    nl, de = (e.config for e in entries)
    assert isinstance(nl, DigitalOceanConfig)
    assert isinstance(de, DigitalOceanConfig)
    assert (nl.regions, de.regions) == (("ams3",), ("fra1",))
    assert de.token_file.startswith("/")


def test_the_shipped_sample_proxy_is_a_valid_proxy_on_do_nl() -> None:
    documents = list(yaml.safe_load_all((EXAMPLES / "digitalocean-proxy.yaml").read_text()))
    proxy = from_object(next(doc for doc in documents if doc["kind"] == "Proxy"))
    assert validate(proxy) == []
    assert proxy.spec.provider == "do-nl"
    assert proxy.spec.placement.region == "ams3"
