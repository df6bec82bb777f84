"""The Proxy spec: what a person declares about one proxy (the Proxy resource's ``spec``, shared
by the CLI and the Kubernetes watcher), and what a pool stamps on each of its members.

In a module of its own so that the proxy and the pool events can both build on it;
``events.schemas`` re-exports these names.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec


class ProxyMode(StrEnum):
    MANAGED = "Managed"
    EXTERNAL = "External"


class Placement(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    region: str = ""
    zone: str = ""
    machine_type: str = ""
    image: str = ""


class SecretRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    key: str = "userdata"


class CloudInit(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    inline: str = ""
    secret_ref: SecretRef | None = None


class External(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    url: str = ""


class HealthCheck(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    url: str = ""
    interval_seconds: float = 1.0
    timeout_seconds: float = 5.0
    failure_threshold: int = 3
    success_threshold: int = 1


class ProxySpec(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    mode: ProxyMode = ProxyMode.MANAGED
    provider: str = ""
    placement: Placement = msgspec.field(default_factory=Placement)
    attributes: dict[str, str] = msgspec.field(default_factory=dict)
    cloud_init: CloudInit | None = None
    external: External | None = None
    health_check: HealthCheck = msgspec.field(default_factory=HealthCheck)
