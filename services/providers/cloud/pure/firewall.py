"""The one firewall a cloud provider entry makes for its proxies, and how GC sees it.

One per provider entry (AWS security group, DigitalOcean cloud firewall, Hetzner firewall), named
and tagged after the entry, made or found by that tag at the first create and shared by every
instance of the entry. It outlives no instance: once the entry has none left, the provider
reports it as a leftover (``FIREWALL_KIND``) and GC deletes it under the same grace and dry-run
rules as everything else; a create after that makes it again.
"""

from __future__ import annotations

import re

FIREWALL_KIND = "firewall"
_UNSAFE = re.compile(r"[^a-z0-9-]+")


def firewall_name(provider_name: str) -> str:
    """A name every cloud accepts (lowercase letters, digits and '-', at most 63 characters)."""
    slug = _UNSAFE.sub("-", provider_name.lower()).strip("-") or "default"
    return f"egress-proxies-{slug}"[:63].rstrip("-")


def firewall_owner(provider_name: str) -> str:
    """The owner a firewall leftover is reported with: never a proxy's uid (so GC's rules judge
    it an orphan once its grace is over), and distinct per provider entry."""
    return f"firewall:{provider_name}"
