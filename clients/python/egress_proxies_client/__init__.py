"""Lease egress proxies from the egress-proxies discovery API.

``AsyncClient`` and ``Client`` speak the API (docs/api.md of the egress-proxies project);
``client.lease(...)`` holds a proxy for a block of work, renewing and releasing it.
``egress_proxies_client.scrapy.LeaseMiddleware`` does the same for a Scrapy crawl.
"""

from egress_proxies_client.aio import AsyncClient, AsyncHeldLease
from egress_proxies_client.errors import (
    AuthError,
    EgressError,
    Forbidden,
    LeaseEnded,
    LeaseLimit,
    LeaseRevoked,
    NoMatchingProxy,
    NoProxyAvailable,
    RotationFailed,
    Unavailable,
    UnknownLease,
    UnknownPool,
    UnknownProxy,
)
from egress_proxies_client.models import Lease, Outcome, Proxy, Report, Rotation
from egress_proxies_client.sync import Client, HeldLease

__all__ = [
    "AsyncClient",
    "AsyncHeldLease",
    "AuthError",
    "Client",
    "EgressError",
    "Forbidden",
    "HeldLease",
    "Lease",
    "LeaseEnded",
    "LeaseLimit",
    "LeaseRevoked",
    "NoMatchingProxy",
    "NoProxyAvailable",
    "Outcome",
    "Proxy",
    "Report",
    "Rotation",
    "RotationFailed",
    "Unavailable",
    "UnknownLease",
    "UnknownPool",
    "UnknownProxy",
]
