"""Lease requests that wait for a proxy (``waitSeconds``), served first come, first served.

A request that finds no proxy free, and may wait, joins this replica's queue. One task serves
the queue while it is not empty: on every change of the views (a release, an expiry recorded,
a proxy turning healthy) and at the earliest time a waiting request's proxies become free
without an event (a lease's end, a cooldown's, a back-off's), it walks the queue in arrival
order and lets each request that now has a free candidate claim one, one request at a time.
An earlier request therefore always gets the first pick; a later one gets what the earlier ones
cannot use (their selectors differ). A new waiting request joins behind those already queued
instead of trying first, so it cannot overtake them.

Across replicas there is no queue: each replica's requests claim through the log, and the lease
fold lets only one claim hold a proxy (never two the same proxy, docs/api.md "Waiting").
A request that stops waiting while its claim is in flight gets that claim's answer; one that
goes away (its client disconnected) after its claim was granted has the lease released.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar

import structlog

from projections.cooldown import Claimant
from projections.lease_queries import available_at
from services.discovery.views import Views

log = structlog.get_logger("egress.discovery")

SAFETY_INTERVAL = 1.0
"""The longest the queue sleeps without a change: a missed wake-up costs at most this."""
MAX_WAITING = 10_000
"""Requests one replica lets wait; beyond, a request is answered at once (503)."""

G = TypeVar("G")
"""A grant (``leases.Granted``): this module does not need to know what is in it."""


@dataclass(eq=False)
class Waiter(Generic[G]):
    """One waiting request: its candidates (uids, target), the future of its grant, and who
    asks (a proxy resting after its own lease is free to it, D153)."""

    candidates: Callable[[], Iterable[str]]
    target: str
    claim: Callable[[], Awaitable[G | None]]
    who: Claimant | None = None
    future: asyncio.Future[G] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    busy: bool = False
    """Its claim is in flight: a request that stops waiting now takes that claim's answer."""


class Queue(Generic[G]):
    def __init__(self, views: Views, release: Callable[[G], Awaitable[None]]) -> None:
        self.views = views
        self.release = release
        self._waiters: deque[Waiter[G]] = deque()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def full(self) -> bool:
        return len(self._waiters) >= MAX_WAITING

    def changed(self) -> None:
        """Called by the views after every event they apply."""
        if self._waiters:
            self._changed.set()

    async def wait(self, waiter: Waiter[G], seconds: float) -> G | None:
        """The grant ``waiter`` gets within ``seconds``; None if it got none."""
        self._waiters.append(waiter)
        self._changed.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._serve(), name="discovery-waiting")
        try:
            done, _ = await asyncio.wait({waiter.future}, timeout=seconds)
            if not done and waiter.busy:
                # Its claim is on its way to the log: its answer is this request's answer.
                await asyncio.wait({waiter.future})
        except asyncio.CancelledError:
            waiter.future.cancel()  # ``_serve`` releases what it is granted after this
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
        if waiter.future.done() and not waiter.future.cancelled():
            return waiter.future.result()
        waiter.future.cancel()
        return None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _serve(self) -> None:
        while self._waiters:
            self._changed.clear()
            await self.serve_once()
            if not self._waiters:
                return
            delay = self._next_delay()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._changed.wait()

    async def serve_once(self) -> None:
        """One pass over the queue in arrival order."""
        now = self.views.now()
        for waiter in list(self._waiters):
            if waiter.future.done() or not self._has_free(waiter, now):
                continue
            waiter.busy = True
            try:
                granted = await waiter.claim()
            except Exception as exc:  # the store's errors: the request answers with them
                if not waiter.future.done():
                    waiter.future.set_exception(exc)
                continue
            finally:
                waiter.busy = False
            if granted is None:
                continue
            if waiter.future.done():
                await self._give_back(granted)
            else:
                waiter.future.set_result(granted)

    def _has_free(self, waiter: Waiter[G], now: datetime) -> bool:
        for uid in waiter.candidates():
            when = available_at(self.views.lease_view(uid), waiter.target, waiter.who)
            if when is None or when <= now:
                return True
        return False

    def _next_delay(self) -> float:
        """Seconds until the earliest time a waiting request's proxy frees up without an event
        saying so; ``SAFETY_INTERVAL`` at most."""
        now = self.views.now()
        soonest = SAFETY_INTERVAL
        for waiter in self._waiters:
            for uid in waiter.candidates():
                when = available_at(self.views.lease_view(uid), waiter.target, waiter.who)
                if when is not None and when > now:
                    soonest = min(soonest, (when - now).total_seconds())
        return max(soonest, 0.001)

    async def _give_back(self, granted: G) -> None:
        """A grant for a request that went away: release it, so the proxy is not stranded."""
        try:
            await self.release(granted)
        except Exception as exc:  # logged; the lease then ends by its TTL
            log.warning("could not release a lease its waiting request left", error=str(exc))
