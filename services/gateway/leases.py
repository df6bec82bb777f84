"""The leases the gateway holds for its crawlers: sessions and rotation (docs/gateway.md,
"Sessions").

A **session** (``session-s1`` in the user name) is one lease of the client, held by
``gateway/session/s1``. Any replica finds it through the API (the client's active leases of that
holder) and adopts it, so two replicas behind a load balancer send one session through one
proxy. When none is active, the lease is taken with an ``Idempotency-Key`` derived from the
client, the session and a generation: replicas racing to start the session send the same key and
get the same lease (docs/api.md, "Idempotency-Key"); a key whose lease has ended answers
``lease_ended``, and the next generation is tried. A session's lease is renewed while it is used
and lapses by itself when it is not, which is the session's idle expiry.

A request **without a session** leaves through one of a few leases the replica holds for that
client and selector (``gateway/rotating``), taken in turn: a proxy per request. They are released
after ``idle`` seconds unused, so a gateway does not sit on proxies a crawler stopped using (a
request that needs a lease meanwhile waits for the release, not to be refused a proxy its
client still holds). A lease whose proxy a host blocked (``report``) takes no more of the
client's requests to that host: they leave through its other leases, or a new one, which the
API gives only from proxies the host has not blocked.

Whatever a lease's proxy becomes (a rotation, a replacement: make-before-break), the gateway
reads the lease again at most ``refresh`` seconds after its last look, in the background, and at
once when the proxy refuses its login or cannot be reached; the old instance keeps serving for
the reconciler's drain meanwhile, so no request fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import structlog

from services.gateway.api import Api, ApiError, Granted
from services.gateway.pure.outcomes import Outcome
from services.gateway.pure.username import Ask

log = structlog.get_logger("egress.gateway")
T = TypeVar("T")

SESSION_HOLDER = "gateway/session/"
ROTATING_HOLDER = "gateway/rotating"
MAX_GENERATIONS = 64
MAX_BACKGROUND = 1024
"""Renewals, re-reads and reports under way at once; beyond, a re-read waits for the next use
and a report is dropped (and counted)."""
MAX_BLOCKED = 1024
"""Blocked hosts remembered per lease; beyond, the API's back-off still applies to new leases."""


@dataclass(frozen=True, slots=True)
class Caller:
    """The crawler a request is for: its name, and its token for the API (``None``: the API
    is open)."""

    name: str
    token: str | None


@dataclass(eq=False)
class Held:
    """A lease the gateway holds, as it last read it."""

    granted: Granted
    caller: Caller
    ttl: float
    expires: float
    """Monotonic time the lease ends if not renewed."""
    checked: float
    used: float = 0.0
    in_flight: int = 0
    gone: bool = False
    """Ended (released, expired, revoked): not to be used again."""
    renewing: bool = False
    """A renewal is under way: the requests meanwhile start no other (one per lease, not one
    per request until the API answers)."""
    blocked: set[str] = field(default_factory=set)
    """Target hosts that answered this lease's proxy with a block: a rotating request for one
    of them takes another lease, as the API keeps the proxy from the host for a new one."""
    _parsed: tuple[str, tuple[str, int, bytes | None]] = ("", ("", 0, None))
    """The URL last parsed, and what it gave: a request reads it, a renewal changes it."""

    @property
    def proxy(self) -> str:
        return self.granted.proxy

    @property
    def lease_id(self) -> str:
        return self.granted.lease_id

    def upstream(self) -> tuple[str, int, bytes | None]:
        """The proxy's host, port and the lease's login (``user:password``), if any."""
        url = self.granted.url
        if self._parsed[0] != url:
            parts = urlsplit(url)
            login = None
            if parts.username is not None:
                login = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self._parsed = (url, (parts.hostname or "", parts.port or 3128, login))
        return self._parsed[1]


@dataclass(eq=False)
class Ring:
    held: list[Held] = field(default_factory=list)
    turn: int = 0
    full_until: float = 0.0
    """The API refused another lease (``maxLeases``, none free) until then."""


class NoLease(Exception):
    """No lease for the request: ``status`` and ``retry_after`` are the answer to give."""

    def __init__(self, message: str, status: int, retry_after: float = 0.0, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.code = code
        """The API's error code, when the API refused."""


class Keeper:
    def __init__(
        self,
        api: Api,
        *,
        rotating: int = 4,
        rotating_ttl: float = 60.0,
        idle: float = 30.0,
        session_ttl: float = 300.0,
        refresh: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.rotating = rotating
        self.rotating_ttl = rotating_ttl
        self.idle = idle
        self.session_ttl = session_ttl
        self.refresh = refresh
        self.clock = clock
        self.sessions: dict[tuple[str, str], Held] = {}
        self.rings: dict[tuple[str, tuple[object, ...]], Ring] = {}
        self._generations: dict[tuple[str, str], int] = {}
        self.locks: dict[tuple[object, ...], asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.dropped = 0

    # ------------------------------------------------------------------ a request's lease

    async def lease(
        self, caller: Caller, ask: Ask, *, exclude: frozenset[str] = frozenset(), target: str = ""
    ) -> Held:
        held = await (
            self._session(caller, ask)
            if ask.session is not None
            else self._rotating(caller, ask, exclude, target)
        )
        self._use(held)
        return held

    def _use(self, held: Held) -> None:
        now = self.clock()
        held.used = now
        if held.expires - now < held.ttl / 2:
            if not held.renewing:
                # Dropped when too much is under way: the next request tries again.
                held.renewing = self._background(self._renew(held))
        elif now - held.checked > self.refresh:
            held.checked = now
            self._background(self.reread(held))

    async def _session(self, caller: Caller, ask: Ask) -> Held:
        assert ask.session is not None
        key = (caller.name, ask.session)
        held = self.sessions.get(key)
        if held is not None and self._live(held):
            return held
        async with self._lock(("session", *key)):
            held = self.sessions.get(key)
            if held is not None and self._live(held):
                return held
            previous = held.granted.proxy_uid if held is not None else None
            ttl = float(ask.ttl or self.session_ttl)
            holder = SESSION_HOLDER + ask.session
            found = await self._api(self.api.holding(caller.token, holder))
            granted = found[0] if found else await self._start(caller, ask, holder, ttl, previous)
            held = self._hold(granted, caller, ttl)
            self.sessions[key] = held
            return held

    async def _start(
        self, caller: Caller, ask: Ask, holder: str, ttl: float, previous: str | None
    ) -> Granted:
        session = ask.session or ""
        first = self._generations.get((caller.name, session), 0)
        for generation in range(first, first + MAX_GENERATIONS):
            key = session_key(caller.name, session, generation)
            self._generations[(caller.name, session)] = generation
            try:
                if previous is not None:
                    # The session's last proxy, if it is free: the same exit as before. The key
                    # does not compare `proxyUid`, so the fallback below may use it again.
                    with contextlib.suppress(ApiError):
                        return await self.api.acquire(
                            caller.token,
                            holder=holder,
                            selector=ask.selector,
                            pool=ask.pool,
                            ttl=ttl,
                            key=key,
                            proxy_uid=previous,
                        )
                    previous = None
                return await self._api(
                    self.api.acquire(
                        caller.token,
                        holder=holder,
                        selector=ask.selector,
                        pool=ask.pool,
                        ttl=ttl,
                        key=key,
                    )
                )
            except NoLease as exc:
                if exc.code != "lease_ended":
                    raise
        raise NoLease(
            f"session {session!r}: {MAX_GENERATIONS} leases in a row had ended; start another",
            503,
            1.0,
        )

    async def _rotating(
        self, caller: Caller, ask: Ask, exclude: frozenset[str], target: str
    ) -> Held:
        ring = self.rings.get((caller.name, ask.key()))
        if ring is None:
            ring = self.rings[(caller.name, ask.key())] = Ring()
        now = self.clock()
        for h in ring.held:  # a new list only when one has ended: most requests see none
            if h.gone or h.expires - now <= 1.0:
                ring.held = [h for h in ring.held if self._live(h)]
                break
        usable = _usable(ring, exclude, target)
        room = len(ring.held) < self.rotating and now >= ring.full_until
        if not usable or (room and not exclude):
            lock = self._lock(("ring", caller.name, *ask.key()))
            if usable and lock.locked():
                pass  # another request is taking one already; use what there is
            else:
                async with lock:
                    ring.held = [h for h in ring.held if self._live(h)]
                    usable = _usable(ring, exclude, target)
                    if not usable or (len(ring.held) < self.rotating and not exclude):
                        try:
                            usable.append(await self._add(ring, caller, ask, exclude, target))
                        except NoLease as exc:
                            ring.full_until = self.clock() + max(exc.retry_after, 1.0)
                            if not usable:
                                raise
        ring.turn += 1
        return usable[ring.turn % len(usable)]

    async def _add(
        self, ring: Ring, caller: Caller, ask: Ask, exclude: frozenset[str], target: str
    ) -> Held:
        granted = await self._api(
            self.api.acquire(
                caller.token,
                holder=ROTATING_HOLDER,
                selector=ask.selector,
                pool=ask.pool,
                ttl=self.rotating_ttl,
                exclude=sorted(exclude | {h.granted.proxy_uid for h in ring.held}),
                target=target or None,
            )
        )
        held = self._hold(granted, caller, self.rotating_ttl)
        ring.held.append(held)
        return held

    # ------------------------------------------------------------------ keeping them

    async def reread(self, held: Held) -> None:
        """Read the lease again: a rotation or a replacement gave it another URL."""
        try:
            granted = await self._api(self.api.get(held.caller.token, held.lease_id))
        except NoLease as exc:
            if exc.status in (404, 410):
                held.gone = True
            return
        held.granted = granted
        held.checked = self.clock()

    async def _renew(self, held: Held) -> None:
        try:
            granted = await self._api(self.api.renew(held.caller.token, held.lease_id, held.ttl))
        except NoLease as exc:
            if exc.status in (404, 410):
                held.gone = True
            return
        finally:
            held.renewing = False
        now = self.clock()
        held.granted, held.checked = granted, now
        held.expires = now + _left(granted)

    def report(self, held: Held, outcome: Outcome, target: str, detail: str) -> None:
        if outcome == "blocked" and len(held.blocked) < MAX_BLOCKED:
            held.blocked.add(target)

        async def send() -> None:
            with contextlib.suppress(NoLease):
                await self._api(
                    self.api.report(held.caller.token, held.lease_id, outcome, target, detail)
                )

        self._background(send())

    async def sweep(self) -> None:
        """Release rotating leases unused for ``idle``; forget sessions whose lease lapsed."""
        now = self.clock()
        for session, held in list(self.sessions.items()):
            if not self._live(held):
                del self.sessions[session]
        for key, ring in list(self.rings.items()):
            idle = [h for h in ring.held if h.in_flight == 0 and now - h.used > self.idle]
            # The ring's lock is held until the API has the releases: a request that needs a
            # lease meanwhile waits for them rather than asking for a proxy still leased.
            lock = self._lock(("ring", key[0], *key[1]))
            if idle and not lock.locked() and len(self._tasks) < MAX_BACKGROUND:
                await lock.acquire()
                for held in idle:
                    ring.held.remove(held)
                    held.gone = True
                self._background(self._release_all(idle, lock))
            if not ring.held:
                del self.rings[key]
        for lock_key in [k for k, lock in self.locks.items() if not lock.locked()]:
            del self.locks[lock_key]

    def counts(self) -> tuple[int, int]:
        """Leases held now: sessions, rotating."""
        return len(self.sessions), sum(len(ring.held) for ring in self.rings.values())

    async def run(
        self, interval: float = 1.0, show: Callable[[int, int], None] | None = None
    ) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.sweep()
            if show is not None:
                show(*self.counts())

    async def close(self) -> None:
        """Release the rotating leases; sessions stay for the other replicas to adopt."""
        held = [h for ring in self.rings.values() for h in ring.held if not h.gone]
        self.rings.clear()
        await asyncio.gather(*(self._release(h) for h in held), return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _release_all(self, held: list[Held], lock: asyncio.Lock) -> None:
        try:
            await asyncio.gather(*(self._release(h) for h in held), return_exceptions=True)
        finally:
            lock.release()

    async def _release(self, held: Held) -> None:
        with contextlib.suppress(NoLease):
            await self._api(self.api.release(held.caller.token, held.lease_id))

    # ------------------------------------------------------------------ helpers

    def _hold(self, granted: Granted, caller: Caller, ttl: float) -> Held:
        now = self.clock()
        return Held(granted, caller, ttl, expires=now + _left(granted), checked=now, used=now)

    def _live(self, held: Held) -> bool:
        return not held.gone and held.expires - self.clock() > 1.0

    def _lock(self, key: tuple[object, ...]) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def _background(self, work: Coroutine[Any, Any, None]) -> bool:
        """Start ``work``; whether it was (not when too much is under way)."""
        if len(self._tasks) >= MAX_BACKGROUND:
            work.close()
            self.dropped += 1
            return False
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _api(self, call: Coroutine[Any, Any, T]) -> T:
        try:
            return await call
        except ApiError as exc:
            raise _no_lease(exc) from exc


def _usable(ring: Ring, exclude: frozenset[str], target: str) -> list[Held]:
    """The ring's leases a request for ``target`` may take: not excluded, not blocked there."""
    return [h for h in ring.held if h.granted.proxy_uid not in exclude and target not in h.blocked]


def session_key(client: str, session: str, generation: int) -> str:
    """The ``Idempotency-Key`` of a session's lease: the same on every replica."""
    digest = hashlib.sha256(f"{client}\0{session}\0{generation}".encode()).hexdigest()
    return f"gw-{digest[:40]}"


def _left(granted: Granted) -> float:
    return max((granted.expires_at - datetime.now(UTC)).total_seconds(), 0.0)


def _no_lease(exc: ApiError) -> NoLease:
    """What the crawler is answered when the API refused the gateway on its behalf."""
    if exc.status == 0:
        return NoLease(f"the discovery API cannot be reached: {exc}", 503, 2.0)
    if exc.status in (401, 403):
        return NoLease(f"the discovery API refused this client: {exc}", 403, code=exc.code)
    if exc.status in (429, 503):
        return NoLease(str(exc), exc.status, exc.retry_after or 1.0, code=exc.code)
    status = exc.status if 400 <= exc.status < 600 else 502
    return NoLease(str(exc), status, code=exc.code)
