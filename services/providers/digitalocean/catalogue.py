"""The entry's cached copy of DigitalOcean's size catalogue, ``/v2/sizes`` (D142).

Read before a create and by the preflight, at most once an hour per provider instance: the
catalogue changes when DigitalOcean adds a region or retires a size, not between two creates,
and every create asking for it would spend the account's hourly request budget on the same
answer. One reader fetches at a time; the others wait for its answer. A create refused by the
API for a size "not available in this region" drops the copy (``forget``): the catalogue was
out of date, and the next check reads it again. What is kept is bounded: one catalogue of at
most ``pure.catalogue.MAX_SIZES`` sizes, read from at most ``MAX_PAGES`` pages.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from services.providers.base import Transient
from services.providers.digitalocean.client import Api
from services.providers.digitalocean.pure import mapping
from services.providers.digitalocean.pure.catalogue import MAX_SIZES, Size, sizes_of

TTL = 3600.0
"""Seconds a read catalogue is used before it is read again."""
PAGE_SIZE = 200
MAX_PAGES = -(-MAX_SIZES // PAGE_SIZE)


class Catalogue:
    """``clock`` is monotonic seconds; tests pass their own to expire the copy."""

    def __init__(
        self, api: Api, provider: str, *, ttl: float = TTL, clock: Callable[[], float] | None = None
    ) -> None:
        self.api = api
        self.provider = provider
        self.ttl = ttl
        self.clock = clock or time.monotonic
        self._sizes: dict[str, Size] | None = None
        self._read_at = 0.0
        self._lock = asyncio.Lock()

    async def sizes(self) -> dict[str, Size]:
        """The catalogue, read now if the copy is missing or older than ``ttl``. Raises the
        taxonomy's errors when it cannot be read."""
        async with self._lock:
            if self._sizes is None or self.clock() - self._read_at >= self.ttl:
                self._sizes = await self._read()
                self._read_at = self.clock()
            return self._sizes

    def forget(self) -> None:
        self._sizes = None

    async def _read(self) -> dict[str, Size]:
        items: list[object] = []
        for page in range(1, MAX_PAGES + 1):
            reply = await self.api.request("list", f"{self.provider}: list sizes", _listing(page))
            found = reply.body.get("sizes")
            found = found if isinstance(found, list) else []
            items += found
            if not found or not mapping.next_page(reply.body):
                break
        sizes = sizes_of(items)
        if not sizes:
            # Refusing every size on an empty answer (a proxy's page, an API change) would fail
            # every create for good; an unread catalogue only leaves the create to the API.
            raise Transient(f"{self.provider}: list sizes: the answer lists no size")
        return sizes


def _listing(page: int) -> Callable[[Any, dict[str, Any]], Any]:
    return lambda c, kw: c.sizes.list(per_page=PAGE_SIZE, page=page, **kw)
