"""Leases shared by the requests of a crawl: the part of the Scrapy middleware that is plain
asyncio, so it does not need Scrapy to be read or reasoned about.

A pooled lease is lent to **one request at a time**. The proxy's address then carries one request
to a site at a time, and the moment a site blocks it, no other request is already queued behind it
for that site: a block learned from one answer holds for every request after it. Concurrency is
the pool's size.

How a request gets a lease (``borrow``), in order:

1. of the free leases that suit it, the one that has rested longest: suiting means not blocked
   for its host, and the session's proxy if the request belongs to a session that has one;
2. a new lease, while the pool has room (acquired with the host as ``target``, and the proxies
   blocked for the host excluded);
3. when the pool is full and none of its leases suits the request, a free lease is released to
   make room for one that does;
4. otherwise it waits for a lease to come back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from egress_proxies_client.aio import AsyncClient, AsyncHeldLease
from egress_proxies_client.errors import (
    EgressError,
    NoMatchingProxy,
    NoProxyAvailable,
    UnknownProxy,
)

MAX_WAIT = 60.0
"""The most ``waitSeconds`` the API accepts."""
MAX_EXCLUDE = 1000
"""The most uids the API accepts in ``exclude``."""


class PoolClosed(EgressError):
    """The crawl is closing: no more leases are lent."""


@dataclass(eq=False)
class Pooled:
    held: AsyncHeldLease
    busy: bool = False
    vouched: set[str] = field(default_factory=set)
    """Hosts a ``success`` was reported for since the lease began or last failed: another one
    would change nothing the API decides on, so it is not sent (docs/decisions.md, D83)."""

    @property
    def uid(self) -> str:
        return self.held.proxy.uid


class LeasePool:
    def __init__(
        self,
        client: AsyncClient,
        *,
        selector: Mapping[str, str],
        ttl: float,
        size: int,
        acquire_timeout: float,
        count: Callable[[str], None] = lambda key: None,
    ) -> None:
        self.client = client
        self.selector = dict(selector)
        self.ttl = ttl
        self.size = size
        self.acquire_timeout = acquire_timeout
        self.count = count
        self.leases: list[Pooled] = []
        self.blocked: dict[str, set[str]] = {}
        """host -> uids of the proxies it blocked."""
        self.sessions: dict[str, str] = {}
        """session -> uid of its proxy."""
        self._pending = 0
        self._binding: set[str] = set()
        """Sessions whose proxy is being leased: their other requests wait for it, rather than
        each binding the session to a proxy of its own."""
        self._busy_until = 0.0
        """Until when the API said no proxy is free (``Retry-After``): meanwhile, a request that
        a lease of the pool will suit once it comes back waits for that rather than asking."""
        self._changed = asyncio.Condition()
        self._closed = False

    def _suits(self, pooled: Pooled, host: str, want: str | None) -> bool:
        return (
            pooled.held.lost is None
            and pooled.uid not in self.blocked.get(host, ())
            and (want is None or pooled.uid == want)
        )

    async def borrow(self, host: str, session: str | None = None) -> Pooled:
        """A lease for one request to ``host``; give it back with ``give_back``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.acquire_timeout
        while True:
            async with self._changed:
                found, evict, want, server_wait = await self._decide(host, session, deadline)
                if found is not None:
                    return found
                self._pending += 1
                if session is not None:
                    self._binding.add(session)
            try:
                if evict is not None:
                    await self._release(evict)
                pooled = await self._acquire(host, want, server_wait)
            except NoProxyAvailable as exc:
                self._busy_until = loop.time() + exc.retry_after
                if loop.time() >= deadline:
                    raise
                continue
            except (NoMatchingProxy, UnknownProxy):
                if want is None or session is None:
                    raise
                self.sessions.pop(session, None)  # its proxy is gone: the session moves on
                continue
            else:
                if session is not None:
                    self.sessions[session] = pooled.uid
                return pooled
            finally:
                async with self._changed:
                    self._pending -= 1
                    self._binding.discard(session or "")
                    self._changed.notify_all()

    async def _decide(
        self, host: str, session: str | None, deadline: float
    ) -> tuple[Pooled | None, Pooled | None, str | None, float]:
        """Under the lock: a lease to lend now, or what to do about getting one (a lease to
        evict, the uid to ask for, how long the API may hold the request)."""
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise PoolClosed("the crawl is closing: no more proxies are lent")
            self._drop_lost()
            now = loop.time()
            if session in self._binding:
                self._check(deadline, now, host)
                await self._wait(deadline - now)
                continue
            want = self.sessions.get(session) if session is not None else None
            if want is not None and want in self.blocked.get(host, ()):
                self.sessions.pop(session or "", None)
                want = None
            suiting = [p for p in self.leases if self._suits(p, host, want)]
            free = next((p for p in suiting if not p.busy), None)
            if free is not None:
                free.busy = True
                if session is not None:
                    self.sessions[session] = free.uid
                return free, None, want, 0.0
            self._check(deadline, now, host)
            # A lease of the pool will suit once it comes back: ask the API for another only
            # while it may have one (and then without being held), else wait for that lease.
            room = len(self.leases) + self._pending < self.size
            if room and not (suiting and now < self._busy_until):
                return None, None, want, 0.0 if suiting else min(deadline - now, MAX_WAIT)
            spare = next((p for p in self.leases if not p.busy), None)
            if not room and not suiting and spare is not None:
                self.leases.remove(spare)
                return None, spare, want, min(deadline - now, MAX_WAIT)
            await self._wait((min(deadline, self._busy_until) if room else deadline) - now)

    def _check(self, deadline: float, now: float, host: str) -> None:
        if now >= deadline:
            raise NoProxyAvailable(
                f"no proxy for {host} within {self.acquire_timeout:g} s (EGRESS_ACQUIRE_TIMEOUT)",
                retry_after=max(self._busy_until - now, 1.0),
            )

    async def _wait(self, timeout: float) -> None:
        """Under the lock: until the pool changes, or ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), max(timeout, 0.0))

    async def _acquire(self, host: str, want: str | None, wait: float) -> Pooled:
        blocked = sorted(self.blocked.get(host, ()))[-MAX_EXCLUDE:]
        held = self.client.lease(
            self.selector, self.ttl, target=host or None, wait=wait, exclude=blocked, proxy_uid=want
        )
        await held.open()
        self.count("acquired")
        pooled = Pooled(held, busy=True)
        async with self._changed:
            self.leases.append(pooled)
        return pooled

    async def give_back(self, pooled: Pooled, *, drop: bool = False) -> None:
        """Back in the pool for the next request; released instead when ``drop`` is set (the
        proxy refused the lease's credentials) or the lease was lost."""
        async with self._changed:
            pooled.busy = False
            drop = drop or pooled.held.lost is not None or self._closed
            if pooled in self.leases:
                # To the back: the lease rested longest is lent first, so every address of
                # the pool carries its share and rests as long as it can between requests.
                self.leases.remove(pooled)
                if not drop:
                    self.leases.append(pooled)
            self._changed.notify_all()
        if drop:
            await self._release(pooled)

    def block(self, host: str, uid: str, session: str | None) -> None:
        self.blocked.setdefault(host, set()).add(uid)
        if session is not None and self.sessions.get(session) == uid:
            del self.sessions[session]

    def _drop_lost(self) -> None:
        for pooled in [p for p in self.leases if p.held.lost is not None and not p.busy]:
            self.leases.remove(pooled)
            self.count("lost")

    async def _release(self, pooled: Pooled) -> None:
        lost = pooled.held.lost
        await pooled.held.close()
        self.count("released" if lost is None else "lost")

    async def close(self) -> None:
        """Releases every lease; requests still waiting for one fail with ``PoolClosed``."""
        async with self._changed:
            self._closed = True
            leases, self.leases = [p for p in self.leases if not p.busy], []
            self._changed.notify_all()
        results = await asyncio.gather(*(self._release(p) for p in leases), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
