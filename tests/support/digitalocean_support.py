"""Shared pieces of the digitalocean provider tests: a config pointing at the fake, the fake's
token, and requests with the fields the tests vary."""

from __future__ import annotations

from typing import Any

from events.schemas import Placement, ProxySpec
from services.providers.base import CreateRequest
from services.providers.digitalocean.config import DigitalOceanConfig
from services.providers.digitalocean.provider import DigitalOceanProvider
from services.providers.digitalocean.testing import DEFAULT_TOKEN, DigitalOceanFake

ENTRY = "do-ams"
CLIENTS = ("198.51.100.0/24", "203.0.113.7/32")


def config(fake: DigitalOceanFake, **overrides: Any) -> DigitalOceanConfig:
    settings: dict[str, Any] = {
        "allowed_clients": CLIENTS,
        "endpoint_url": fake.url,
        "timeout_seconds": 10.0,
    }
    settings.update(overrides)
    return DigitalOceanConfig(**settings)


def provider(
    fake: DigitalOceanFake, name: str = ENTRY, *, token: str = DEFAULT_TOKEN, **overrides: Any
) -> DigitalOceanProvider:
    page_size = overrides.pop("page_size", 200)
    return DigitalOceanProvider(name, config(fake, **overrides), token=token, page_size=page_size)


def request(
    name: str,
    *,
    owner_uid: str = "owner-1",
    cloud_init: str = "",
    spec_hash: str = "abc123",
    **placement: str,
) -> CreateRequest:
    return CreateRequest(
        name=name,
        owner_uid=owner_uid,
        namespace="crawl",
        proxy_name=name,
        spec=ProxySpec(provider=ENTRY, placement=Placement(**placement)),
        spec_hash=spec_hash,
        cloud_init=cloud_init,
    )
