"""Shared pieces of the digitalocean provider tests: a config pointing at the fake, the fake's
token, requests with the fields the tests vary, and the fake and a provider on it as fixtures (a
test module imports them by name)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from events.schemas import InstanceState, Placement
from services.providers.base import CreateRequest
from services.providers.digitalocean.config import DigitalOceanConfig
from services.providers.digitalocean.provider import DigitalOceanProvider
from services.testing.digitalocean import DEFAULT_TOKEN, DigitalOceanFake
from tests.contract.provider import closing
from tests.support.cloud_requests import cloud_request
from tests.support.markers import starts

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


async def running(do: DigitalOceanProvider, pid: str) -> None:
    """The fake makes a droplet active at once: three gets are plenty, and waiting longer would
    hide a provider that never reads the state right."""
    for _ in range(3):
        if (await do.get(pid)).state is InstanceState.RUNNING:
            return
    pytest.fail(f"{pid} not running after three gets")


@pytest.fixture
@starts("a local HTTP fake of the DigitalOcean API")
def fake() -> Iterator[DigitalOceanFake]:
    with DigitalOceanFake() as server:
        yield server


@pytest.fixture
async def do(fake: DigitalOceanFake) -> AsyncIterator[DigitalOceanProvider]:
    """A provider on the fake, closed after; a test deletes what it means to."""
    async with closing(provider(fake)) as made:
        yield made
