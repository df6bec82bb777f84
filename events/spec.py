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


class EgressCheck(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    url: str = ""
    """The echo URL fetched through this proxy to learn its public address; "" takes the
    provider's or the health service's (``--egress-echo-url``)."""


class EgressExpect(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    country: str = ""
    """ISO 3166 alpha-2 (``de``): the country a site must see."""
    asn: tuple[int, ...] = ()
    """The autonomous systems the address may belong to (any of them)."""


class OnMismatch(StrEnum):
    KEEP = "keep"
    """Keep the proxy, out of leasing, until its egress matches again."""
    REPLACE = "replace"
    """Replace it (make-before-break), a bounded number of times."""


class Egress(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    expect: EgressExpect = msgspec.field(default_factory=EgressExpect)
    on_mismatch: OnMismatch = OnMismatch.KEEP


class ProxySpec(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    mode: ProxyMode = ProxyMode.MANAGED
    provider: str = ""
    placement: Placement = msgspec.field(default_factory=Placement)
    attributes: dict[str, str] = msgspec.field(default_factory=dict)
    cloud_init: CloudInit | None = None
    external: External | None = None
    health_check: HealthCheck = msgspec.field(default_factory=HealthCheck)
    # None rather than an empty struct: a spec that says nothing of egress encodes as it did
    # before these fields, so its content hash (and the ids derived from it) stay the same.
    egress: Egress | None = None
    """What the proxy's egress must be (docs/decisions/0111-verified-egress.md)."""
    egress_check: EgressCheck | None = None

    @property
    def egress_rules(self) -> Egress:
        return self.egress or _NO_EGRESS

    @property
    def egress_url(self) -> str:
        return self.egress_check.url if self.egress_check is not None else ""


_NO_EGRESS = Egress()
