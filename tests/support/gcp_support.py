"""Shared pieces of the gcp provider tests: the fake's project, a config pointing at a fake, and
requests with the fields the tests vary."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from events.schemas import ProxySpec
from services.providers.base import CreateRequest
from services.providers.gcp.config import GcpConfig
from services.providers.gcp.provider import GcpProvider
from services.testing.gcp import ComputeFake

PROJECT = "test-project"
ZONE = "europe-west1-b"


def config(fake: ComputeFake, **overrides: Any) -> GcpConfig:
    settings: dict[str, Any] = {"project": PROJECT, "zone": ZONE, "api_endpoint": fake.url}
    settings.update(overrides)
    return GcpConfig(**settings)


def request(name: str, *, cloud_init: str = "", **spec: Any) -> CreateRequest:
    return CreateRequest(
        name=name,
        owner_uid="owner-1",
        namespace="crawl",
        proxy_name=name,
        spec=ProxySpec(provider="gcp-eu", **spec),
        spec_hash="abc123",
        cloud_init=cloud_init,
    )


@pytest.fixture(name="fake")
def compute_fake() -> Iterator[ComputeFake]:
    """A local Compute Engine REST fake for the project ``PROJECT``."""
    with ComputeFake(PROJECT) as server:
        yield server


@pytest.fixture(name="gcp")
async def gcp_provider(fake: ComputeFake) -> AsyncIterator[GcpProvider]:
    """A gcp provider named ``gcp-eu`` on ``fake``, closed afterwards."""
    provider = GcpProvider("gcp-eu", config(fake))
    yield provider
    await provider.close()
