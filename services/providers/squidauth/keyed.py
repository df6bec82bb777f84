"""Hand every instance its proxy key: a wrapper around a provider whose entry enforces leases.

The key is derived here, at create, from the master secret and the proxy's uid, and travels in
the ``CreateRequest`` only, never in an event: the log holds the cloud-init the reconciler
resolved, not what a provider was finally given. Local and kubernetes providers read
``request.lease_auth`` themselves; for VM providers, whose Squid is configured by cloud-init,
this wrapper appends the lease part to the cloud-init (``cloudinit.py``), so the VM providers
need not know about leases at all.

Optional capabilities (``LeftoverCleaner``) are kept, as in ``instrumented.py``.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from importlib import resources

from services.providers.base import (
    CreateRequest,
    Instance,
    LeaseAuth,
    Leftover,
    LeftoverCleaner,
    Provider,
)
from services.providers.squidauth.pure.cloudinit import with_lease_auth
from services.providers.squidauth.pure.scheme import proxy_key

VM_TYPES = frozenset({"gcp", "kvm", "aws", "digitalocean", "hetzner"})
"""Provider types whose Squid is the image's, configured through cloud-init."""


@cache
def helper_source() -> str:
    """The helper as shipped to instances: this package's ``helper.py``, read once."""
    return (resources.files(__package__ or "") / "helper.py").read_text(encoding="utf-8")


def lease_auth_for(master: bytes, proxy_uid: str, fence_floor: int = 0) -> LeaseAuth:
    return LeaseAuth(
        key=proxy_key(master, proxy_uid).hex(), helper=helper_source(), fence_floor=fence_floor
    )


def lease_keyed(provider: Provider, master: bytes) -> LeaseKeyed:
    if isinstance(provider, LeftoverCleaner):
        return LeaseKeyedCleaner(provider, master)
    return LeaseKeyed(provider, master)


class LeaseKeyed:
    """A ``Provider`` whose creates carry the instance's lease key."""

    def __init__(self, provider: Provider, master: bytes) -> None:
        self.inner = provider
        self.name = provider.name
        self.type = provider.type
        self._master = master

    def __repr__(self) -> str:
        return f"LeaseKeyed({self.inner!r})"

    async def create(self, request: CreateRequest) -> str:
        auth = lease_auth_for(self._master, request.owner_uid, request.fence_floor)
        if self.type in VM_TYPES:
            cloud_init = with_lease_auth(
                request.cloud_init, auth.key, auth.helper, auth.fence_floor
            )
            request = dataclasses.replace(request, cloud_init=cloud_init, lease_auth=auth)
        else:
            request = dataclasses.replace(request, lease_auth=auth)
        return await self.inner.create(request)

    async def get(self, provider_id: str) -> Instance:
        return await self.inner.get(provider_id)

    async def delete(self, provider_id: str) -> None:
        await self.inner.delete(provider_id)

    async def list_by_tag(self) -> list[Instance]:
        return await self.inner.list_by_tag()

    async def close(self) -> None:
        await self.inner.close()


class LeaseKeyedCleaner(LeaseKeyed):
    def __init__(self, provider: Provider, master: bytes) -> None:
        if not isinstance(provider, LeftoverCleaner):
            raise TypeError(f"provider {provider.name!r} cannot clean leftovers; use lease_keyed()")
        super().__init__(provider, master)
        self.cleaner: LeftoverCleaner = provider

    async def leftovers(self) -> list[Leftover]:
        return await self.cleaner.leftovers()

    async def delete_leftover(self, leftover: Leftover) -> bool:
        return await self.cleaner.delete_leftover(leftover)
