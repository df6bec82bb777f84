"""Shared pieces of the digitalocean provider tests: a config pointing at the fake, the fake's
token, and requests with the fields the tests vary."""

from __future__ import annotations

from typing import Any

from events.schemas import Placement
from services.providers.base import CreateRequest
from services.providers.digitalocean.config import DigitalOceanConfig
from services.providers.digitalocean.provider import DigitalOceanProvider
from services.providers.digitalocean.testing import DEFAULT_TOKEN, DigitalOceanFake
from tests.support.cloud_requests import cloud_request

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


def request(name: str, **fields: str) -> CreateRequest:
    """The fields beyond the request's own (owner_uid, cloud_init, spec_hash) are placement's."""
    own = {k: fields.pop(k) for k in ("owner_uid", "cloud_init", "spec_hash") if k in fields}
    return cloud_request(ENTRY, name, placement=Placement(**fields), **own)
