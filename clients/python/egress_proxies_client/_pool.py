"""Leases shared by the requests of a crawl: the part of the Scrapy middleware that is plain
asyncio, so it does not need Scrapy to be read or reasoned about.

A pooled lease carries at most ``concurrency`` requests at once (one by default). A block learned
from one answer holds for every request lent after it: a lease is never lent again for a host that
blocked its proxy.

How a request gets a lease (``borrow``), in order:

1. of the leases that suit it and have room, the least loaded, then the one that has rested
   longest: suiting means not blocked for its host, and the session's proxy if the request
   belongs to a session that has one;
2. a new lease, while the pool has room (acquired with the host as ``target``, and both the
   proxies blocked for the host and those the pool already holds excluded: the API cannot give
   the pool a proxy it holds, so it is never asked to wait for one,
   docs/decisions/0097-a-pooled-request-waits-for-the.md);
3. when the pool is full and none of its leases suits the request, a lease with nothing on it is
   released to make room for one that does;
4. otherwise it waits for a lease to come back.

While a new lease is being acquired (the API may hold the request up to ``waitSeconds``), the
request also waits for a lease of the pool to come back: whichever comes first serves it. A lease
acquired after its request was served joins the pool for the next one.
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
HELD_ALL = 5.0
"""How long the pool takes an answer "every matching proxy is one you hold" to hold: meanwhile a
request waits for the pool's own leases instead of asking again."""


class PoolClosed(EgressError):
    """The crawl is closing: no more leases are lent."""


@dataclass(eq=False)
class Pooled:
    held: AsyncHeldLease
    carrying: int = 0
    """Requests lent this lease and not given back yet."""
    retired: bool = False
    """Lent no more: released once the requests it carries come back."""
    vouched: set[str] = field(default_factory=set)
    """Hosts a ``success`` was reported for since the lease began or last failed: another one
    would change nothing the API decides on, so it is not sent
    (docs/decisions/0083-the-client-library-leases.md)."""

    @property
    def uid(self) -> str:
        return self.held.proxy.uid


@dataclass(eq=False)
class _Ticket:
    """One request's acquire: whether the request still waits for its lease."""

    waiting: bool = True


class LeasePool:
    def __init__(
        self,
        client: AsyncClient,
        *,
        selector: Mapping[str, str],
        ttl: float,
        size: int,
        acquire_timeout: float,
        concurrency: int = 1,
        count: Callable[[str], None] = lambda key: None,
        pool: str | None = None,
    ) -> None:
        self.client = client
        self.selector = dict(selector)
        self.pool = pool
        """A ProxyPool (``NAMESPACE/NAME``) every lease is taken from, besides the selector."""
        self.ttl = ttl
        self.size = size
        self.acquire_timeout = acquire_timeout
        self.concurrency = concurrency
        self.count = count
        self.leases: list[Pooled] = []
        self.blocked: dict[str, set[str]] = {}
        """host -> uids of the proxies it blocked."""
        self.sessions: dict[str, str] = {}
        """session -> uid of its proxy."""
        self._pending = 0
        """Acquires under way, counted against ``size``."""
        self._spares: set[asyncio.Task[Pooled]] = set()
        """Acquires whose request was served by a lease of the pool first."""
        self._binding: set[str] = set()
        """Sessions whose proxy is being leased: their other requests wait for it, rather than
        each binding the session to a proxy of its own."""
        self._busy_until = 0.0
        """Until when the API said it has no other proxy for the pool (``Retry-After``, or every
        matching proxy is the pool's): meanwhile, a request that a lease of the pool will suit
        once it comes back waits for that rather than asking."""
        self._changed = asyncio.Event()
        """Set, and replaced, whenever a lease comes back, joins or leaves the pool."""
        self._closed = False

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _suits(self, pooled: Pooled, host: str, want: str | None) -> bool:
        return (
            pooled.held.lost is None
            and not pooled.retired
            and pooled.uid not in self.blocked.get(host, ())
            and (want is None or pooled.uid == want)
        )

    def _lend(self, host: str, session: str | None, want: str | None) -> Pooled | None:
        """A suiting lease with room, now counted as carrying the request."""
        roomy = [
            p for p in self.leases if self._suits(p, host, want) and p.carrying < self.concurrency
        ]
        if not roomy:
            return None
        pooled = min(roomy, key=lambda p: p.carrying)  # the first such: rested longest
        pooled.carrying += 1
        if session is not None:
            self.sessions[session] = pooled.uid
        return pooled

    async def borrow(self, host: str, session: str | None = None) -> Pooled:
        """A lease for one request to ``host``; give it back with ``give_back``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.acquire_timeout
        while True:
            found, evict, want, server_wait = await self._decide(host, session, deadline)
            if found is not None:
                return found
            held = {p.uid for p in self.leases if p.held.lost is None} - {want}
            exclude = sorted(self.blocked.get(host, set()) | held)[-MAX_EXCLUDE:]
            ticket = _Ticket()
            self._pending += 1
            if session is not None:
                self._binding.add(session)
            acquiring = asyncio.ensure_future(
                self._acquire(
                    host, want=want, wait=server_wait, exclude=exclude, evict=evict, ticket=ticket
                )
            )
            try:
                return await self._first(acquiring, ticket, host, session, want)
            except NoProxyAvailable as exc:
                self._busy_until = loop.time() + exc.retry_after
                if loop.time() >= deadline:
                    raise
            except (NoMatchingProxy, UnknownProxy):
                if want is None and held - self.blocked.get(host, set()):
                    # Every proxy the API has for the host is one the pool holds: wait for them.
                    self._busy_until = loop.time() + HELD_ALL
                elif want is None or session is None:
                    raise
                else:
                    self.sessions.pop(session, None)  # its proxy is gone: the session moves on
            finally:
                self._binding.discard(session or "")
                self._notify()

    async def _first(
        self,
        acquiring: asyncio.Task[Pooled],
        ticket: _Ticket,
        host: str,
        session: str | None,
        want: str | None,
    ) -> Pooled:
        """The acquired lease, or one of the pool's that comes back first; the acquire then
        goes on as a spare, its lease joining the pool free."""
        try:
            while not acquiring.done():
                pooled = self._lend(host, session, want)
                if pooled is not None:
                    return pooled
                changed = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait((acquiring, changed), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
            pooled = acquiring.result()
            if session is not None:
                self.sessions[session] = pooled.uid
            return pooled
        finally:
            if not acquiring.done():
                ticket.waiting = False
                self._spares.add(acquiring)
                acquiring.add_done_callback(self._spare_done)

    def _spare_done(self, task: asyncio.Task[Pooled]) -> None:
        self._spares.discard(task)
        # A spare's failure concerns no request (its own was served): it is only counted.
        if not task.cancelled() and task.exception() is not None:
            self.count("spare_unused")

    async def _decide(
        self, host: str, session: str | None, deadline: float
    ) -> tuple[Pooled | None, Pooled | None, str | None, float]:
        """A lease to lend now, or what to do about getting one (a lease to evict, the uid to
        ask for, how long the API may hold the request)."""
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
            lent = self._lend(host, session, want)
            if lent is not None:
                return lent, None, want, 0.0
            suiting = any(self._suits(p, host, want) for p in self.leases)
            self._check(deadline, now, host)
            # A lease of the pool will suit once it comes back: ask the API for another only
            # while it may have one (and then without being held), else wait for that lease.
            room = len(self.leases) + self._pending < self.size
            # A lease being acquired may suit too: the API holds (``waitSeconds``) only a request
            # that nothing of the pool's can serve, so no cancelled wait outlives the crawl.
            coming = suiting or self._pending > 0
            if room and not (coming and now < self._busy_until):
                return None, None, want, 0.0 if coming else min(deadline - now, MAX_WAIT)
            spare = next((p for p in self.leases if p.carrying == 0), None)
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
        """Until the pool changes, or ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), max(timeout, 0.0))

    async def _acquire(
        self,
        host: str,
        *,
        want: str | None,
        wait: float,
        exclude: list[str],
        evict: Pooled | None,
        ticket: _Ticket,
    ) -> Pooled:
        try:
            if evict is not None:
                await self._release(evict)
            held = self.client.lease(
                self.selector,
                self.ttl,
                target=host or None,
                wait=wait,
                exclude=exclude,
                proxy_uid=want,
                pool=self.pool,
            )
            await held.open()
            self.count("acquired")
            if self._closed:
                await self._release(Pooled(held))
                raise PoolClosed("the crawl is closing: no more proxies are lent")
            # The request, if it still waits, carries it at once: no other can take it first.
            pooled = Pooled(held, carrying=1 if ticket.waiting else 0)
            self.leases.append(pooled)
            return pooled
        finally:
            self._pending -= 1
            self._notify()

    async def give_back(self, pooled: Pooled, *, drop: bool = False) -> None:
        """Back in the pool for the next request; released instead, once the last request it
        carries is back, when ``drop`` is set (the proxy refused the lease's credentials) or the
        lease was lost."""
        pooled.carrying -= 1
        pooled.retired = pooled.retired or drop or pooled.held.lost is not None or self._closed
        release = pooled.retired and pooled.carrying == 0
        if pooled in self.leases:
            # To the back: the lease rested longest is lent first, so every address of the
            # pool carries its share and rests as long as it can between requests.
            self.leases.remove(pooled)
            if not release:
                self.leases.append(pooled)
        self._notify()
        if release:
            await self._release(pooled)

    def block(self, host: str, uid: str, session: str | None) -> None:
        self.blocked.setdefault(host, set()).add(uid)
        if session is not None and self.sessions.get(session) == uid:
            del self.sessions[session]

    def _drop_lost(self) -> None:
        for pooled in [p for p in self.leases if p.held.lost is not None and p.carrying == 0]:
            self.leases.remove(pooled)
            self.count("lost")

    async def _release(self, pooled: Pooled) -> None:
        lost = pooled.held.lost
        await pooled.held.close()
        self.count("released" if lost is None else "lost")

    async def close(self) -> None:
        """Releases every lease; requests still waiting for one fail with ``PoolClosed``."""
        self._closed = True
        spares = list(self._spares)
        for task in spares:
            task.cancel()
        await asyncio.gather(*spares, return_exceptions=True)
        for pooled in self.leases:
            pooled.retired = True  # released by ``give_back`` once its requests are back
        leases, self.leases = [p for p in self.leases if p.carrying == 0], []
        self._notify()
        results = await asyncio.gather(*(self._release(p) for p in leases), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
