"""The gateway's port: every connection from a crawler, request by request (docs/gateway.md).

A request is authenticated (the proxy login: the client's name with parameters, and its token),
given a lease (``leases.Keeper``) and relayed (``relay``). Whatever reaches the port gets an
answer of its own or the site's, never a crash: a bad head is a 400 (before any login is looked
at: a head that is not a proxy request says so), a bad login a 407 with the reason in
``X-Egress-Error``, a client over its connections a 429. A slow or hostile client costs only its
own connections: every wait is bounded (``bounds``), connections per address and in all
(docs/decisions/0156-the-gateway-s-edges.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter as Tally
from dataclasses import dataclass, field
from typing import NoReturn

import structlog

from services.gateway.bounds import (
    LINGER,
    LINGER_BYTES,
    Limits,
    Refusal,
    drain,
    idle_upstream,
)
from services.gateway.crawler import Crawler
from services.gateway.doorman import Doorman
from services.gateway.fast import Early, Lane
from services.gateway.leases import Caller, Held, Keeper, NoLease
from services.gateway.metrics import GatewayMetrics
from services.gateway.pure import heads
from services.gateway.pure.heads import HeadError, Target
from services.gateway.pure.outcomes import MAX_RETRY_BODY, judge
from services.gateway.pure.traffic import Exchange
from services.gateway.pure.username import Ask
from services.gateway.reading import Request, Response, final_part, parse_request
from services.gateway.relay import Traffic, Upstreams
from services.gateway.traffic import TrafficRecorder
from services.gateway.tunnel import Tunnels
from services.gateway.upstream import Upstream, UpstreamError
from services.gateway.wire import CONTINUE, Targets, copy_exactly, marked
from services.runtime.clients import Clients
from services.runtime.pure.throttle import LoginThrottle

log = structlog.get_logger("egress.gateway")


@dataclass
class Gateway:
    keeper: Keeper
    clients: Clients
    metrics: GatewayMetrics
    limits: Limits = field(default_factory=Limits)
    block_codes: tuple[int, ...] = (403, 429)
    own_ports: tuple[int, ...] = ()
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    doorman: Doorman = field(init=False)
    tunnels: Tunnels = field(init=False)
    traffic: TrafficRecorder | None = None
    upstreams: Upstreams = field(init=False)
    _per_address: Tally[str] = field(default_factory=Tally)
    _open: int = 0
    by_callbacks: int = 0
    """Requests answered from callbacks alone (``fast.Lane``)."""
    handed_back: int = 0
    """Requests the callbacks sent and handed to a coroutine (no success, or no answer)."""

    def __post_init__(self) -> None:
        self.doorman = Doorman(self.clients, self.metrics, self.throttle)
        self.limits = self.limits.fitted()
        self.upstreams = Upstreams(
            connect_timeout=self.limits.connect_timeout,
            max_idle=min(idle_upstream(), self.limits.upstreams // 2),
            max_open=self.limits.upstreams,
        )
        self.tunnels = Tunnels(
            self.keeper, self.upstreams, self.limits, self.block_codes, self._lease, self.count
        )

    def protocol(self) -> Crawler:
        """A new crawler connection's protocol (the listening server's factory)."""
        return Crawler(self.serve)

    async def serve(self, crawler: Crawler) -> None:
        peer = crawler.transport.get_extra_info("peername")
        address = str(peer[0]) if peer else "unknown"
        if (
            self._per_address[address] >= self.limits.per_address
            or self._open >= self.limits.connections
        ):
            # Answered and closed at once, not lingered on: the excess of a flood must not hold
            # descriptors (what it sent, if anything, is not read; a reset may overtake the 429).
            self.metrics.refusals.labels("connections").inc()
            which = "from this address" if self._open < self.limits.connections else "in all"
            with contextlib.suppress(OSError, RuntimeError):
                crawler.write(
                    heads.answer(
                        429, f"too many connections {which}", extra=[(b"Retry-After", b"1")]
                    )
                )
            crawler.transport.close()
            return
        self._per_address[address] += 1
        self._open += 1
        self.metrics.connections.inc()
        lane = Lane(self, crawler, address)
        crawler.fast = lane.take
        try:
            await self._requests(crawler, lane)
        except Refusal as refusal:
            if refusal.kind:
                self.metrics.refusals.labels(refusal.kind).inc()
            await crawler.linger(refusal.answer, LINGER, LINGER_BYTES)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, HeadError, UpstreamError):
            pass  # the crawler or the proxy went away, stalled or spoke nonsense mid-answer
        finally:
            crawler.fast = None
            if crawler.resume is not None:
                crawler.resume.close()  # the task ended before it ran it
                crawler.resume = None
            self._per_address[address] -= 1
            if not self._per_address[address]:
                del self._per_address[address]
            self._open -= 1
            self.metrics.connections.dec()
            crawler.close(self.limits.idle_timeout)

    async def _requests(self, crawler: Crawler, lane: Lane) -> None:
        first = True
        while True:
            timeout = self.limits.head_timeout if first else self.limits.idle_timeout
            try:
                raw = await crawler.head(timeout)
                request = parse_request(raw) if raw else None
            except TimeoutError:
                if not first or crawler.served:
                    return  # an idle keep-alive connection, closed quietly
                self.metrics.refusals.labels("head").inc()
                reason = f"no whole request head within {timeout:g} s"
                raise Refusal(heads.answer(408, reason)) from None
            except HeadError as exc:
                self.metrics.refusals.labels("head").inc()
                raise Refusal(heads.answer(exc.status, str(exc))) from None
            first = False
            resume, crawler.resume = crawler.resume, None
            if resume is not None:
                if not await resume:  # a request the callbacks sent and handed back
                    return
                continue
            if request is None or not await self._request(
                request, crawler, lane.address, lane.targets
            ):
                return

    async def _request(
        self, request: Request, crawler: Crawler, address: str, cache: Targets
    ) -> bool:
        """Answer one request; whether the connection may carry another."""
        try:
            target, why = cache.get(request.method, request.url, self.own_ports)
        except HeadError as exc:
            self._refuse(exc.status, str(exc), "target")
        refusal = self.doorman.who(request.headers, address, (request.login, request.params))
        if isinstance(refusal, bytes):
            raise Refusal(refusal)
        caller, ask = refusal
        if why is not None:
            self._refuse(403, f"the gateway does not go there: {why}", "target")
        if request.method == "CONNECT":
            await self.tunnels.tunnel(caller, ask, target, crawler)
            return False
        if request.chunked:
            self._refuse(
                411,
                "send the request body with a Content-Length (chunked bodies are not relayed)",
                "body",
            )
        return await self.forward(caller, ask, target, request, crawler)

    def _refuse(self, status: int, reason: str, kind: str) -> NoReturn:
        self.metrics.refusals.labels(kind).inc()
        raise Refusal(heads.answer(status, reason))

    async def _lease(self, caller: Caller, ask: Ask, *, exclude: frozenset[str], host: str) -> Held:
        try:
            return await self.keeper.lease(caller, ask, exclude=exclude, target=host)
        except NoLease as exc:
            wait = str(max(math.ceil(exc.retry_after), 1)).encode()
            extra = [(b"Retry-After", wait)] if exc.retry_after else []
            self.metrics.refusals.labels("no_lease").inc()
            answer = heads.answer(exc.status, f"no proxy for this request: {exc}", extra=extra)
            raise Refusal(answer) from None

    # ------------------------------------------------------------------ plain HTTP

    async def forward(
        self,
        caller: Caller,
        ask: Ask,
        target: Target,
        request: Request,
        crawler: Crawler,
        *,
        early: Early | None = None,
    ) -> bool:
        """Answer a plain request; ``early``: the callbacks sent it, and hand it on
        (``fast.Lane``)."""
        body: bytes | None = None
        if request.expects_continue and request.length and request.version == b"1.1":
            crawler.write(CONTINUE)  # the crawler waits for it before its body (curl: 1 s)
        if request.length <= MAX_RETRY_BODY:
            body = await self._body(crawler, request.length)
        exclude: frozenset[str] = frozenset()
        for attempt in range(2):
            if early is not None:
                held = early.held  # attempt 0 was sent by the callbacks
            else:
                held = await self._lease(caller, ask, exclude=exclude, host=target.host)
            held.in_flight += 1
            try:
                sent = await self._send(held, request, body, crawler, early)
            finally:
                held.in_flight -= 1
            early = None
            if isinstance(sent, str):
                self.keeper.report(held, "failed", target.host, sent)
                self.count(caller, held, "failed", Traffic(), host=target.host)
                if attempt == 0 and body is not None and ask.session is None:
                    exclude |= {held.granted.proxy_uid}
                    continue
                raise Refusal(heads.answer(502, f"the proxy {held.proxy} failed: {sent}"))
            (up, response, seen), (host, port) = sent, held.upstream()[:2]
            verdict = judge(
                response.status,
                response.squid_error,
                request.method,
                block_codes=self.block_codes,
                attempt=attempt,
                replayable=body is not None,
                sticky=ask.session is not None,
            )
            if verdict.outcome != "success":
                self.keeper.report(held, verdict.outcome, target.host, f"HTTP {response.status}")
            if verdict.retry:
                up.close()
                self.count(
                    caller,
                    held,
                    verdict.outcome,
                    Traffic(len(seen)),
                    host=target.host,
                    status=response.status,
                )
                exclude |= {held.granted.proxy_uid}
                continue
            traffic = Traffic(up=request.length, down=len(seen))
            try:
                crawler.write(marked(seen, held))
                whole = response.complete or await up.relay(crawler, self.limits.idle_timeout)
                await drain(crawler, self.limits.idle_timeout)
            except BaseException:
                up.close()  # the crawler left or stalled mid-answer: the proxy's goes too
                raise
            finally:
                traffic.down += up.down
            if whole and response.keep_alive:
                self.upstreams.give_back(host, port, up)
            else:
                up.close()
            self.count(
                caller, held, verdict.outcome, traffic, host=target.host, status=response.status
            )
            return whole and request.keep_alive and response.keep_alive
        return False

    async def _body(self, crawler: Crawler, length: int) -> bytes:
        """A request body small enough to keep for a retry, within ``idle_timeout`` (408)."""
        if not length:
            return b""
        try:
            return await crawler.readexactly(length, self.limits.idle_timeout)
        except TimeoutError:
            self._refuse(
                408,
                f"the request body did not arrive within {self.limits.idle_timeout:g} s",
                "body",
            )

    async def _send(
        self,
        held: Held,
        request: Request,
        body: bytes | None,
        crawler: Crawler,
        early: Early | None = None,
    ) -> tuple[Upstream, Response, bytes] | str:
        """Send the request through the lease's proxy; the connection, the response so far and
        its bytes, or why it could not be sent. A kept connection the proxy closed meanwhile, or
        a login the proxy refuses (the lease moved: renewed or rotated), is tried once more.
        ``early``: the first send was the callbacks', and this is what came of it."""
        for again in range(3):
            if early is not None:
                up, failure, early = early.up, early.failure, None
                head = b""
            else:
                failure = None
                host, port, login = held.upstream()
                head = request.upstream_head(login)
                try:
                    up = await self.upstreams.take(host, port, fresh=again > 0)
                except UpstreamError as exc:
                    if again == 0:
                        await self.keeper.reread(held)
                        continue
                    return str(exc)
            try:
                if failure is not None:
                    raise failure
                if head:
                    up.send(head + (body or b""), head_only=request.method == "HEAD")
                    if body is None:
                        await copy_exactly(crawler, up, request.length, self.limits.idle_timeout)
                    response, seen = await up.answer(self.limits.answer_timeout)
                else:
                    response, seen = up.response, bytes(up.seen)
                seen = final_part(seen, response.interims)
            except (UpstreamError, OSError, asyncio.IncompleteReadError) as exc:
                up.close()
                if body is None:
                    return f"the proxy closed the connection: {exc}"
                continue
            except TimeoutError:
                up.close()
                return "the proxy did not answer in time"
            except HeadError as exc:
                up.close()
                return str(exc)
            except BaseException:
                up.close()
                raise
            if response.status == 407 and again < 2 and body is not None:
                up.close()
                await self.keeper.reread(held)
                continue
            return up, response, seen
        return "the proxy refused the lease's login"

    def count(
        self,
        caller: Caller,
        held: Held,
        outcome: str,
        traffic: Traffic,
        *,
        tunnel: bool = False,
        host: str = "",
        status: int = 0,
    ) -> None:
        kind = "tunnel" if tunnel else "http"
        self.metrics.exchange(caller.name, kind, outcome, traffic.up, traffic.down)
        if self.traffic is not None:
            g = held.granted
            self.traffic.count(
                Exchange(
                    caller.name,
                    g.proxy_uid,
                    g.proxy,
                    g.lease_id,
                    host,
                    outcome,
                    status,
                    traffic.up,
                    traffic.down,
                    tunnel,
                )
            )

    def close(self) -> None:
        self.upstreams.close()
