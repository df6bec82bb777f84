"""GCE's machine-type catalogue, asked before a create and by the preflight, cached.

A machine type is offered in some zones only (``c3-standard-4`` is not everywhere, ``e2``
neither in every new zone), and GCE refuses an insert naming it elsewhere with a 400 that says
nothing of where it would work. So before an insert the provider asks ``machineTypes.get`` in
the zone; when the zone lacks it, the create fails ``Permanent`` naming the field and the zones
that offer it (``aggregatedList`` filtered by name), and the reconciler latches the Proxy Failed
instead of retrying (docs/decisions/0140-gcp-images-as-they-boot.md).

Answers are cached per provider instance, for ``TTL`` seconds and ``SIZE`` entries at most (the
oldest goes first): a pool scaling out asks once an hour, not once a VM. A failed lookup is not
cached. The calls block; callers run them in a worker thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from google.api_core import exceptions as core
from google.cloud import compute_v1

from services.providers.cloud.pure.expiring import Expiring
from services.providers.gcp.pure import mapping

TTL = 3600.0
SIZE = 256
V = TypeVar("V")


class Cache:
    """The cloud catalogue cache (``cloud.pure.expiring``) behind a lock: the google client's
    calls run in worker threads."""

    def __init__(
        self, *, ttl: float = TTL, size: int = SIZE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.clock = clock
        # Each value in a 1-tuple: an answer of None ("not offered") is cached like any other.
        self._entries: Expiring[tuple[str, ...], tuple[object]] = Expiring(ttl=ttl, size=size)
        self._lock = threading.Lock()

    def get_or(self, key: tuple[str, ...], compute: Callable[[], V]) -> V:
        """The cached value of ``key``, or ``compute()`` stored (an exception is not)."""
        now = self.clock()
        with self._lock:
            hit = self._entries.get(key, now)
        if hit is not None:
            return hit[0]  # type: ignore[return-value]  # stored by this key's compute
        value = compute()
        with self._lock:
            self._entries.put(key, (value,), now)
        return value

    def __len__(self) -> int:
        return len(self._entries)


class Catalogue:
    """Machine types by zone, for one provider instance's project."""

    def __init__(
        self,
        client: Callable[[], compute_v1.MachineTypesClient],
        project: str,
        timeout: float,
        cache: Cache | None = None,
    ) -> None:
        self.client = client
        self.project = project
        self.timeout = timeout
        self.cache = cache or Cache()

    def guest_cpus(self, zone: str, name: str) -> int | None:
        """The vCPUs of machine type ``name`` in ``zone``, or None when the zone lacks it."""

        def ask() -> int | None:
            try:
                found = self.client().get(
                    project=self.project,
                    zone=zone,
                    machine_type=name,
                    timeout=self.timeout,
                    retry=None,
                )
            except core.NotFound:
                return None
            return int(found.guest_cpus)

        return self.cache.get_or(("type", zone, name), ask)

    def zones_offering(self, name: str) -> tuple[str, ...]:
        """Every zone of the project's catalogue that offers machine type ``name``."""

        def ask() -> tuple[str, ...]:
            request = compute_v1.AggregatedListMachineTypesRequest(
                project=self.project, filter=f'name = "{name}"', max_results=500
            )
            pages = self.client().aggregated_list(request=request, timeout=self.timeout, retry=None)
            zones = {
                mapping.short_name(scope)
                for scope, scoped in pages
                if any(found.name == name for found in scoped.machine_types)
            }
            return tuple(sorted(zones))

        return self.cache.get_or(("zones", name), ask)
