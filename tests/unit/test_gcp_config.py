"""The ``gcp:`` block of the providers config: every mistake stops start-up naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from events.proxyresource import from_object, validate
from services.providers.config import build_providers, parse_providers_config
from services.providers.gcp.config import GcpConfig
from services.providers.gcp.provider import GcpProvider
from services.runtime.settings.errors import ConfigError

EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "providers-gcp.yaml"


def parse(block: object, name: str = "gcp-eu") -> Any:
    raw = {"providers": [{"name": name, "type": "gcp", "gcp": block}]}
    (entry,) = parse_providers_config(
        raw, source="providers.yaml", base_dir=Path("/cfg"), default_data_dir=Path("/data")
    )
    return entry


def test_a_minimal_block_gets_the_documented_defaults() -> None:
    entry = parse({"project": "my-project"})
    assert entry.config == GcpConfig(project="my-project")
    config: GcpConfig = entry.config
    assert (config.network, config.network_tag, config.disk_size_gb) == (
        "default",
        "egress-proxy",
        10,
    )
    assert (config.zone, config.machine_type) == ("", "e2-small")
    assert config.image == "projects/debian-cloud/global/images/family/debian-12"
    assert (config.api_endpoint, config.timeout_seconds) == ("", 30.0)


def test_camel_case_fields_are_read() -> None:
    config = parse(
        {
            "project": "example.com:crawl-egress",
            "network": "projects/net-host/global/networks/shared",
            "subnetwork": "proxies",
            "networkTag": "egress",
            "diskSizeGb": 20,
            "serviceAccount": "vm@crawl-egress.iam.gserviceaccount.com",
            "zone": "europe-west1-b",
            "machineType": "e2-micro",
            "image": "projects/my-images/global/images/squid-1",
            "timeoutSeconds": 5,
            "apiEndpoint": "http://127.0.0.1:8089",
        }
    ).config
    assert config.network_tag == "egress"
    assert config.disk_size_gb == 20
    assert config.api_endpoint == "http://127.0.0.1:8089"


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({}, "gcp: project is required"),
        (None, "gcp: project is required"),
        ({"project": "My Project"}, "project 'My Project' is not a GCP project id"),
        ({"project": "123456789012"}, "not a GCP project id"),
        ({"projectId": "my-project"}, "unknown field `projectId`"),
        ({"project": "my-project", "diskSizeGb": 5}, "gcp.diskSizeGb: Expected `int` >= 10"),
        ({"project": "my-project", "diskSizeGb": "ten"}, "gcp.diskSizeGb: Expected `int`"),
        ({"project": "my-project", "networkTag": "Egress_Proxy"}, "networkTag 'Egress_Proxy'"),
        ({"project": "my-project", "zone": "Europe West"}, "zone 'Europe West'"),
        ({"project": "my-project", "network": ""}, "network is required"),
        ({"project": "my-project", "network": "my net"}, "network 'my net'"),
        ({"project": "my-project", "machineType": ""}, "machineType ''"),
        ({"project": "my-project", "image": ""}, "image ''"),
        ({"project": "my-project", "serviceAccount": "vm"}, "serviceAccount 'vm'"),
        ({"project": "my-project", "apiEndpoint": "localhost:8089"}, "apiEndpoint"),
        ({"project": "my-project", "apiEndpoint": "https://x/compute/v1"}, "(no path)"),
        ({"project": "my-project", "timeoutSeconds": 0}, "gcp.timeoutSeconds"),
    ],
)
def test_mistakes_name_the_entry_and_the_field(block: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(block)
    text = str(caught.value)
    assert "providers[0] (gcp-eu)" in text
    assert message in text


def test_the_block_must_sit_under_its_type() -> None:
    raw = {"providers": [{"name": "gcp-eu", "type": "gcp", "local": {"project": "my-project"}}]}
    with pytest.raises(ConfigError, match="exactly one settings block `gcp:`"):
        parse_providers_config(raw, source="p.yaml", base_dir=Path(), default_data_dir=Path())


def test_building_does_no_io_and_keeps_the_settings() -> None:
    providers = build_providers([parse({"project": "my-project", "zone": "us-east1-b"})])
    provider = providers["gcp-eu"]
    assert isinstance(provider, GcpProvider)
    assert (provider.name, provider.type) == ("gcp-eu", "gcp")
    assert provider.config.zone == "us-east1-b"


def test_the_shipped_example_parses_into_two_named_instances_of_one_type() -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    entries = parse_providers_config(
        raw, source=str(EXAMPLE), base_dir=EXAMPLE.parent, default_data_dir=Path("/data")
    )
    gcp = [entry for entry in entries if entry.type == "gcp"]
    assert [entry.name for entry in gcp] == ["gcp-eu", "gcp-us"]
    eu, us = (entry.config for entry in gcp)
    assert isinstance(eu, GcpConfig)
    assert isinstance(us, GcpConfig)
    assert eu.project == us.project
    assert eu.zone != us.zone


def test_the_shipped_sample_proxy_is_a_valid_proxy_on_gcp_eu() -> None:
    documents = list(yaml.safe_load_all((EXAMPLE.parent / "gcp-proxy.yaml").read_text()))
    proxy = from_object(next(doc for doc in documents if doc["kind"] == "Proxy"))
    assert validate(proxy) == []
    assert proxy.spec.provider == "gcp-eu"
    assert proxy.spec.placement.zone.startswith("europe-west1-")
