"""The settings every cloud VM provider block has, validated when the providers config is read.

Each cloud's block (``aws:``, ``digitalocean:``, ``hetzner:``) subclasses ``CloudSettings`` and
adds its own fields; ``check_cloud_settings`` names the field and the fix of the first problem.
``allowedClients`` has no default: the firewall opens the proxy port to these ranges only, so an
operator says who the crawlers (and the health prober) are, and a world-open proxy is written
out as ``0.0.0.0/0`` on purpose, never assumed.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated
from urllib.parse import urlparse

import msgspec

WORLD = frozenset({"0.0.0.0/0", "::/0"})
MAX_CLIENT_RANGES = 60
"""Fewer than any of the three clouds allows in one firewall rule set (AWS: 60 rules per
security group by default), so a valid config is one the cloud accepts."""


class CloudSettings(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    allowed_clients: tuple[str, ...] = ()
    """CIDRs that may reach the proxy port: the crawlers' and the health prober's addresses."""
    proxy_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 3128
    endpoint_url: str = ""
    """The cloud API's base URL: an AWS-compatible endpoint, a regional one, or a test fake."""
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=600)] = 30.0
    install_squid: bool = True
    """Add the user-data part that installs and configures the egress Squid (Debian and Ubuntu
    images); false when the Proxy's own cloud-init installs it."""


def check_cloud_settings(settings: CloudSettings) -> str:
    """The first problem with the shared fields, or ``""``."""
    if not settings.allowed_clients:
        return (
            "allowedClients is required: the CIDRs of your crawlers and of the health prober, "
            "e.g. [203.0.113.0/24]; the firewall opens the proxy port to them only "
            "(0.0.0.0/0 opens it to the world, deliberately)"
        )
    if len(settings.allowed_clients) > MAX_CLIENT_RANGES:
        return (
            f"allowedClients has {len(settings.allowed_clients)} ranges; at most "
            f"{MAX_CLIENT_RANGES} fit in one firewall: merge them into larger ranges"
        )
    for cidr in settings.allowed_clients:
        try:
            ipaddress.ip_network(cidr, strict=True)
        except ValueError as exc:
            return f"allowedClients: {cidr!r} is not a CIDR ({exc}); use e.g. 203.0.113.0/24"
    if settings.endpoint_url:
        url = urlparse(settings.endpoint_url)
        if url.scheme not in ("http", "https") or not url.netloc or url.path not in ("", "/"):
            return (
                f"endpointUrl {settings.endpoint_url!r}: use a base URL such as "
                "https://api.example.internal (no path), or leave it out for the cloud's own"
            )
    return ""


def client_networks(settings: CloudSettings) -> list[str]:
    """``allowedClients`` in canonical form, IPv4 first: what a firewall rule lists."""
    networks = [ipaddress.ip_network(cidr, strict=True) for cidr in settings.allowed_clients]
    networks.sort(key=lambda n: (n.version, n))
    return [str(n) for n in networks]
