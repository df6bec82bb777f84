"""The common request answered from callbacks alone (docs/gateway.md, "How a request goes";
docs/decisions/0166-the-gateway-s-callbacks-path.md).

Most of a crawl is one kind of request: a bodiless GET or HEAD on a keep-alive connection, from
a crawler whose login passed before, for a lease the gateway holds, to a proxy with an idle
connection open. Such a request is taken where its head arrives (``Crawler.data_received``),
sent on at once, and its answer judged where its head arrives (``Upstream.data_received``):
a success is written through to the crawler as it comes, counted, and the proxy's connection
given back, with no task step, future or coroutine on the way. The connection's task meanwhile
waits for a head as before, and is woken only when there is something for it.

Whatever is not plain goes the coroutine's way (``server.Gateway``), unchanged: a head the
callbacks would have to refuse or wait on (a body, CONNECT, a login to check, a lease to take,
renew or read again, no idle connection, a crawler not reading) is left to the task; an answer
that is not a success (a block code, Squid's own error, a 407), or no answer (a closed
connection, a timeout, nonsense), is handed to it at the point the coroutine would have reached
(``Early``), so a block is still judged before anything is written and an idempotent request
still goes once more through another proxy.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, NamedTuple

from services.gateway.crawler import Crawler
from services.gateway.leases import Caller, Held, Keeper, Ring
from services.gateway.pure.heads import HeadError, Target
from services.gateway.pure.outcomes import judge
from services.gateway.pure.username import Ask
from services.gateway.reading import Request, final_part, parse_request, take_head
from services.gateway.relay import Traffic
from services.gateway.upstream import PAUSED, Upstream, UpstreamError
from services.gateway.wire import Targets, marked

if TYPE_CHECKING:
    from services.gateway.server import Gateway

PLAIN = ("GET", "HEAD")


class Early(NamedTuple):
    """A request the callbacks sent and hand back: its lease, the proxy's connection, and what
    went wrong before the answer's head was whole (``None``: the head is, and is no success)."""

    held: Held
    up: Upstream
    failure: BaseException | None


class Lane:
    """One crawler connection's callbacks' path; ``take`` is its ``Crawler.fast``."""

    def __init__(self, gateway: Gateway, crawler: Crawler, address: str) -> None:
        self.gateway = gateway
        self.crawler = crawler
        self.address = address
        self.targets = Targets()
        """The connection's last target, shared with the task's requests."""
        self._loop = asyncio.get_running_loop()
        self._request = Request()
        self._caller = Caller("", None)
        self._ask = Ask()
        self._target = Target("", 0, "")
        self._held: Held | None = None
        self._up: Upstream | None = None
        self._proxy = ("", 0)
        self._down = 0
        self._relaying = False

    # ------------------------------------------------------------------ a head arrives

    def take(self) -> bool:
        """Answer the buffer's next head here if it is the common request; whether the task
        may sleep on (nothing whole, or a request under way)."""
        crawler = self.crawler
        if crawler.writing_paused or crawler.eof:
            return False
        try:
            raw = take_head(crawler.buffer)
        except HeadError:
            return False  # the task reads it again and answers the refusal
        if raw is None:
            return True
        try:
            started = self._start(parse_request(raw))
        except HeadError:
            started = False
        if not started:
            crawler.buffer[:0] = raw  # the task's, as it came
            return False
        crawler.took()
        return True

    def _start(self, request: Request) -> bool:
        gateway = self.gateway
        if request.method not in PLAIN or request.length or request.chunked:
            return False
        target, why = self.targets.get(request.method, request.url, gateway.own_ports)
        if why is not None:
            return False
        found = gateway.doorman.known((request.login, request.params), self.address)
        if found is None:
            return False
        caller, ask = found
        found_lease = ready(gateway.keeper, caller, ask, target.host)
        if found_lease is None:
            return False
        held, ring = found_lease
        host, port, login = held.upstream()
        up = gateway.upstreams.idle_one(host, port)
        if up is None:
            return False  # the coroutine takes this lease, and opens a connection for it
        if ring is not None:
            ring.turn += 1  # the lease is taken: the ring turns, as ``Keeper.lease`` turns it
        held.used = gateway.keeper.clock()
        head = request.upstream_head(login)
        try:
            up.send(head, head_only=request.method == "HEAD")
        except UpstreamError:
            up.close()
            return False
        up.on_event = self._event
        up.arm(gateway.limits.answer_timeout)
        held.in_flight += 1
        self.crawler.busy = True
        self._request, self._caller, self._ask, self._target = request, caller, ask, target
        self._held, self._up, self._proxy = held, up, (host, port)
        self._down, self._relaying = 0, False
        return True

    # ------------------------------------------------------------------ the proxy answers

    def _event(self, outcome: object) -> None:
        """What the proxy's connection tells: the head whole (``None``), the answer whole
        (``True``), cut or stalled (``False``), the crawler full (``PAUSED``), an error."""
        up, held = self._up, self._held
        if up is None or held is None:
            return
        if self._relaying:
            if outcome is PAUSED:
                self.crawler.on_drained = self._drained
            elif isinstance(outcome, bool):
                self._finish(outcome)
            else:
                self._fail()  # the crawler left, or the rest is unreadable: no count
            return
        failure = outcome if isinstance(outcome, BaseException) else None
        if failure is None and not self.crawler.lost:
            response = up.response
            verdict = judge(
                response.status,
                response.squid_error,
                self._request.method,
                block_codes=self.gateway.block_codes,
                sticky=self._ask.session is not None,
            )
            if response.status != 407 and verdict.outcome == "success":
                seen = final_part(bytes(up.seen), response.interims)
                self._down = len(seen)
                self.crawler.write(marked(seen, held))
                if response.complete:
                    self._finish(True)
                    return
                self._relaying = True
                up.begin_relay(self.crawler.transport, self.gateway.limits.idle_timeout)
                return
        self._hand_back(Early(held, up, failure))

    def _drained(self) -> None:
        self.crawler.on_drained = None
        if self._up is not None and self._relaying:
            self._up.arm(self.gateway.limits.idle_timeout)
            self._up.resume()

    def _finish(self, whole: bool) -> None:
        """The answer ended (as framed, or not): counted as the coroutine counts it."""
        up, held = self._up, self._held
        assert up is not None
        assert held is not None
        gateway, crawler, request = self.gateway, self.crawler, self._request
        self._clear(held)
        response = up.response
        if whole and response.keep_alive:
            gateway.upstreams.give_back(*self._proxy, up)
        else:
            up.close()
        traffic = Traffic(up=0, down=self._down + up.down)
        gateway.count(
            self._caller, held, "success", traffic, host=self._target.host, status=response.status
        )
        gateway.by_callbacks += 1
        crawler.served += 1
        if whole and request.keep_alive and response.keep_alive and not crawler.lost:
            crawler.rearm(gateway.limits.idle_timeout)
            if crawler.buffer or crawler.eof:
                self._loop.call_soon(self._next)  # a pipelined head, or the end: not re-entered
        else:
            crawler.ended = True
            crawler.wake()

    def _fail(self) -> None:
        up, held = self._up, self._held
        assert up is not None
        assert held is not None
        self._clear(held)
        up.close()
        self.crawler.ended = True
        self.crawler.wake()

    def _hand_back(self, early: Early) -> None:
        early.up.hold()
        self._clear(early.held)
        self.gateway.handed_back += 1
        request, crawler = self._request, self.crawler
        crawler.resume = self.gateway.forward(
            self._caller, self._ask, self._target, request, crawler, early=early
        )
        crawler.wake()

    def _clear(self, held: Held) -> None:
        if self._up is not None:
            self._up.on_event = None
        held.in_flight -= 1
        self._up = self._held = None
        self._relaying = False
        self.crawler.on_drained = None
        self.crawler.busy = False

    def _next(self) -> None:
        crawler = self.crawler
        if not crawler.parked or crawler.busy or crawler.resume is not None or crawler.ended:
            return
        if not self.take():
            crawler.wake()


def ready(keeper: Keeper, caller: Caller, ask: Ask, host: str) -> tuple[Held, Ring | None] | None:
    """The lease ``Keeper.lease`` would give at once, with nothing to start meanwhile (a
    lease to add, a renewal, a re-read), and its ring, not turned yet: ``None`` when there is
    something."""
    now = keeper.clock()
    ring = None
    if ask.session is not None:
        held = keeper.sessions.get((caller.name, ask.session))
        if held is None or held.gone or held.expires - now <= 1.0:
            return None
    else:
        ring = keeper.rings.get((caller.name, ask.key()))
        if ring is None:
            return None
        if len(ring.held) < keeper.rotating and now >= ring.full_until:
            # Room for another lease: the coroutine takes one, unless a request is at it
            # already, when it too uses what there is.
            lock = keeper.locks.get(("ring", caller.name, *ask.key()))
            if lock is None or not lock.locked():
                return None
        usable = []
        for h in ring.held:
            if h.gone or h.expires - now <= 1.0:
                return None
            if host not in h.blocked:
                usable.append(h)
        if not usable:
            return None
        held = usable[(ring.turn + 1) % len(usable)]
    if held.expires - now < held.ttl / 2 or now - held.checked > keeper.refresh:
        return None
    return held, ring
