"""The ``aws:`` block of the providers config: every mistake stops start-up naming the entry, the
field and the fix; the shipped examples parse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from events.proxyresource import from_object, validate
from services.providers.aws.config import DEFAULT_IMAGE, DEFAULT_INSTANCE_TYPE, AwsConfig
from services.providers.aws.provider import AwsProvider
from services.providers.config import build_providers, parse_providers_config
from services.runtime.settings.errors import ConfigError

EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "providers-aws.yaml"
MINIMAL = {"region": "eu-west-1", "allowedClients": ["203.0.113.0/24"]}


def parse(block: object, name: str = "aws-eu") -> Any:
    raw = {"providers": [{"name": name, "type": "aws", "aws": block}]}
    (entry,) = parse_providers_config(
        raw, source="providers.yaml", base_dir=Path("/cfg"), default_data_dir=Path("/data")
    )
    return entry


def test_a_minimal_block_gets_the_documented_defaults() -> None:
    config: AwsConfig = parse(MINIMAL).config
    assert isinstance(config, AwsConfig)
    assert (config.region, config.zones, config.subnets, config.vpc_id) == ("eu-west-1", (), (), "")
    assert (config.instance_type, config.image) == (DEFAULT_INSTANCE_TYPE, DEFAULT_IMAGE)
    assert DEFAULT_INSTANCE_TYPE == "t3.nano"
    assert DEFAULT_IMAGE == "resolve:ssm:/aws/service/debian/release/12/latest/amd64"
    assert (config.spot, config.key_name, config.profile) == (False, "", "")
    assert (config.proxy_port, config.endpoint_url, config.timeout_seconds) == (3128, "", 30.0)
    assert config.install_squid is True


def test_camel_case_fields_are_read() -> None:
    config: AwsConfig = parse(
        {
            **MINIMAL,
            "zones": ["eu-west-1a", "eu-west-1b", "eu-west-1-lax-1a"],
            "subnets": ["subnet-0123456789abcdef0", "subnet-12345678"],
            "instanceType": "t4g.micro",
            "image": "ami-0123456789abcdef0",
            "vpcId": "vpc-0123456789abcdef0",
            "profile": "crawl-egress",
            "spot": True,
            "keyName": "ops key 2024",
            "proxyPort": 8080,
            "endpointUrl": "http://127.0.0.1:5000",
            "timeoutSeconds": 5,
            "installSquid": False,
        }
    ).config
    assert config.zones[2] == "eu-west-1-lax-1a"
    assert config.subnets == ("subnet-0123456789abcdef0", "subnet-12345678")
    assert (config.instance_type, config.vpc_id, config.key_name) == (
        "t4g.micro",
        "vpc-0123456789abcdef0",
        "ops key 2024",
    )
    assert (config.spot, config.proxy_port, config.install_squid) == (True, 8080, False)


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({}, "allowedClients is required"),
        (None, "allowedClients is required"),
        ({"allowedClients": ["203.0.113.0/24"]}, "region is required"),
        ({**MINIMAL, "region": "Ireland"}, "region 'Ireland': use a region code"),
        ({**MINIMAL, "region": "eu-west"}, "region 'eu-west'"),
        ({**MINIMAL, "region": 1}, "aws.region: Expected `str`, got `int`"),
        ({**MINIMAL, "allowedClients": []}, "allowedClients is required"),
        ({**MINIMAL, "allowedClients": ["crawlers"]}, "'crawlers' is not a CIDR"),
        ({**MINIMAL, "allowedClients": ["10.0.0.1/8"]}, "'10.0.0.1/8' is not a CIDR"),
        ({**MINIMAL, "allowedClients": "10.0.0.0/8"}, "aws.allowedClients: Expected `array`"),
        (
            {**MINIMAL, "allowedClients": [f"10.0.{n}.0/24" for n in range(61)]},
            "allowedClients has 61 ranges",
        ),
        ({**MINIMAL, "zones": ["us-east-1a"]}, "zones: 'us-east-1a': use an availability zone"),
        ({**MINIMAL, "zones": ["eu-west-10a"]}, "zones: 'eu-west-10a'"),
        ({**MINIMAL, "zones": ["eu-west-1A"]}, "zones: 'eu-west-1A'"),
        ({**MINIMAL, "zones": ["eu-west-1a", "eu-west-1a"]}, "'eu-west-1a' is listed twice"),
        ({**MINIMAL, "zones": ["eu-west-1a"] * 40}, "zones has 40 entries; at most 32"),
        ({**MINIMAL, "zones": "eu-west-1a"}, "aws.zones: Expected `array`"),
        ({**MINIMAL, "subnets": ["subnet-xyz"]}, "subnets: 'subnet-xyz' is not a subnet id"),
        ({**MINIMAL, "subnets": [""]}, "subnets: '' is not a subnet id"),
        ({**MINIMAL, "subnets": [f"subnet-{n:08x}" for n in range(65)]}, "at most 64"),
        ({**MINIMAL, "instanceType": ""}, "instanceType '': use an EC2 instance type"),
        ({**MINIMAL, "instanceType": "t3 nano"}, "instanceType 't3 nano'"),
        ({**MINIMAL, "image": ""}, "image '': use an AMI id"),
        ({**MINIMAL, "image": "debian-12"}, "image 'debian-12'"),
        ({**MINIMAL, "image": "resolve:ssm:"}, "image 'resolve:ssm:'"),
        ({**MINIMAL, "image": "ami-0123 ; rm -rf /"}, "image 'ami-0123 ; rm -rf /'"),
        ({**MINIMAL, "vpcId": "default"}, "vpcId 'default' is not a VPC id"),
        ({**MINIMAL, "profile": "my profile"}, "profile 'my profile'"),
        ({**MINIMAL, "keyName": "ops\nkey"}, "keyName 'ops\\nkey'"),
        ({**MINIMAL, "keyName": "k" * 256}, "keyName"),
        ({**MINIMAL, "spot": "yes"}, "aws.spot: Expected `bool`, got `str`"),
        ({**MINIMAL, "proxyPort": 0}, "aws.proxyPort: Expected `int` >= 1"),
        ({**MINIMAL, "proxyPort": 70000}, "aws.proxyPort: Expected `int` <= 65535"),
        ({**MINIMAL, "timeoutSeconds": 0}, "aws.timeoutSeconds"),
        ({**MINIMAL, "endpointUrl": "localhost:5000"}, "endpointUrl 'localhost:5000'"),
        ({**MINIMAL, "endpointUrl": "ftp://example.com"}, "endpointUrl"),
        ({**MINIMAL, "endpointUrl": "https://ec2.example/api"}, "(no path)"),
        ({**MINIMAL, "instance_type": "t3.nano"}, "unknown field `instance_type`"),
        ({**MINIMAL, "accessKeyId": "AKIA..."}, "unknown field `accessKeyId`"),
        ({**MINIMAL, "zone": "eu-west-1a"}, "unknown field `zone`"),
    ],
)
def test_mistakes_name_the_entry_and_the_field(block: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(block)
    text = str(caught.value)
    assert "providers[0] (aws-eu)" in text
    assert message in text


def test_a_block_that_is_not_a_mapping_is_refused() -> None:
    for block in (["eu-west-1"], "eu-west-1", 3):
        with pytest.raises(ConfigError, match=r"providers\[0\] \(aws-eu\): aws"):
            parse(block)


def test_building_does_no_io_and_keeps_the_settings() -> None:
    providers = build_providers([parse({**MINIMAL, "zones": ["eu-west-1b"]})])
    provider = providers["aws-eu"]
    assert isinstance(provider, AwsProvider)
    assert (provider.name, provider.type) == ("aws-eu", "aws")
    assert provider.config.zones == ("eu-west-1b",)
    assert "eu-west-1" in repr(provider)


def test_the_shipped_example_parses_into_two_named_instances_of_one_type() -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    entries = parse_providers_config(
        raw, source=str(EXAMPLE), base_dir=EXAMPLE.parent, default_data_dir=Path("/data")
    )
    assert [(e.name, e.type) for e in entries] == [("aws-eu", "aws"), ("aws-us", "aws")]
    eu, us = (entry.config for entry in entries)
    assert isinstance(eu, AwsConfig)
    assert isinstance(us, AwsConfig)
    assert (eu.region, us.region) == ("eu-west-1", "us-east-2")
    assert us.spot
    assert us.subnets


def test_the_shipped_sample_proxy_is_a_valid_proxy_on_aws_eu() -> None:
    documents = list(yaml.safe_load_all((EXAMPLE.parent / "aws-proxy.yaml").read_text()))
    proxy = from_object(next(doc for doc in documents if doc["kind"] == "Proxy"))
    assert validate(proxy) == []
    assert proxy.spec.provider == "aws-eu"
    assert proxy.spec.placement.zone.startswith("eu-west-1")
