"""The create requests the cloud provider tests (aws, digitalocean, hetzner) send: a Proxy in
namespace ``crawl`` named like its instance, with only the fields a test varies given."""

from __future__ import annotations

from typing import Any

from events.schemas import ProxySpec
from services.providers.base import CreateRequest


def cloud_request(
    entry: str,
    name: str,
    *,
    owner_uid: str = "owner-1",
    cloud_init: str = "",
    spec_hash: str = "abc123",
    **spec: Any,
) -> CreateRequest:
    """``spec`` holds the ProxySpec's fields beyond the provider entry (placement, ...)."""
    return CreateRequest(
        name=name,
        owner_uid=owner_uid,
        namespace="crawl",
        proxy_name=name,
        spec=ProxySpec(provider=entry, **spec),
        spec_hash=spec_hash,
        cloud_init=cloud_init,
    )
