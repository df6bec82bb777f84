"""Shared pieces of the gcp provider tests: the fake's project, a config pointing at a fake, and
requests with the fields the tests vary."""

from __future__ import annotations

from typing import Any

from events.schemas import ProxySpec
from services.providers.base import CreateRequest
from services.providers.gcp.config import GcpConfig
from services.providers.gcp.testing import ComputeFake

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
