"""A client's ``maxLeases``, counted before a lease is granted, not after
(docs/decisions/0135-counters-that-hold.md).

Counted from the view alone, twelve acquires of one client arriving together each saw the leases
the view held before any of them was appended, and all twelve were granted. So a request takes a
reservation before it tries: on this replica, the leases the view holds for the client plus its
requests being granted (waiting ones included) never pass the limit. A retry with the same
Idempotency-Key shares the reservation of the request it repeats: it is that request.

Another replica's grants are known only from the log. So a limited client's claims are appended
one at a time on each replica, each after this replica's view has read the lease stream to its
end and still finds the client under its limit. What the log does not show yet is then at most
one grant per other replica, the bound docs/api.md gives ("Clients", Limits). Unlimited and
admin clients take none of this.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from services.discovery.http.access import LeaseLimit
from services.discovery.views import Views


@dataclass(frozen=True, slots=True)
class Limit:
    """Who a request counts against, and how many leases that client may hold."""

    client: str
    max_leases: int


class Quota:
    """The reservations and claim locks of limited clients on this replica."""

    def __init__(self, views: Views, view_timeout: float) -> None:
        self.views = views
        self.view_timeout = view_timeout
        self._reserved: dict[str, Counter[object]] = {}
        """client -> reservation token (the Idempotency-Key, or a fresh object) -> requests."""
        self._locks: dict[str, asyncio.Lock] = {}

    def held(self, client: str) -> int:
        """The client's active leases as this replica's view has them."""
        now = self.views.now()
        return sum(
            1
            for view in self.views.active_leases()
            if view.current is not None
            and view.current.client == client
            and view.current.expires_at > now
        )

    def reserved(self, client: str) -> int:
        return len(self._reserved.get(client, ()))

    def remaining(self, limit: Limit) -> int:
        """Leases the client may still be granted here: what demand may count it for."""
        return max(limit.max_leases - self.held(limit.client) - self.reserved(limit.client), 0)

    @contextlib.contextmanager
    def reserve(self, limit: Limit | None, key: str = "") -> Iterator[None]:
        """Hold a place under the client's limit while the request is served; ``LeaseLimit``
        (429) when there is none. ``key``: the request's Idempotency-Key ("" without one)."""
        if limit is None:
            yield
            return
        token: object = ("key", key) if key else object()
        tokens = self._reserved.setdefault(limit.client, Counter())
        if token not in tokens:
            held = self.held(limit.client)
            if held + len(tokens) >= limit.max_leases:
                if not tokens:
                    del self._reserved[limit.client]
                raise _over(limit, held, len(tokens))
        tokens[token] += 1
        try:
            yield
        finally:
            tokens[token] -= 1
            if tokens[token] <= 0:
                del tokens[token]
            if not tokens and self._reserved.get(limit.client) is tokens:
                del self._reserved[limit.client]
                lock = self._locks.get(limit.client)
                if lock is not None and not lock.locked():
                    # A claim of a waiting request that left may still hold it.
                    del self._locks[limit.client]

    @contextlib.asynccontextmanager
    async def claiming(self, limit: Limit | None) -> AsyncIterator[None]:
        """Around one attempt to claim a proxy: a limited client's claims one at a time on this
        replica, each after the view has read the lease stream to its end and found the client
        still under its limit (``LeaseLimit`` otherwise)."""
        if limit is None:
            yield
            return
        lock = self._locks.setdefault(limit.client, asyncio.Lock())
        async with lock:
            end = await self.views.lease_log_seq()
            with contextlib.suppress(TimeoutError):
                await self.views.wait_for_lease_seq(end, self.view_timeout)
            held = self.held(limit.client)
            if held >= limit.max_leases:
                raise _over(limit, held, 0)
            yield


def _over(limit: Limit, held: int, granting: int) -> LeaseLimit:
    being = f" and is being granted {granting} more" if granting else ""
    return LeaseLimit(
        f"client {limit.client!r} holds {held} leases{being}, its limit (maxLeases "
        f"{limit.max_leases}); release one first",
        headers={"Retry-After": "1"},
    )
