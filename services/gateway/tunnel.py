"""CONNECT through the gateway: a lease's proxy opens the tunnel, the gateway answers ``200
Connection established`` with the proxy and lease it took, then pumps bytes both ways without
reading them (docs/gateway.md, "How a request goes"). It sees only whether the tunnel opened: a
refusal by the proxy is that proxy's outcome for the target, and the first failure of a request
without a session is tried once more through another proxy."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from services.gateway.bounds import Limits, Refusal, close, drain
from services.gateway.crawler import Crawler
from services.gateway.leases import Caller, Held, Keeper
from services.gateway.pump import pump_sides, stream_side
from services.gateway.pure import heads
from services.gateway.pure.heads import HeadError, Target
from services.gateway.pure.outcomes import Outcome
from services.gateway.pure.username import Ask
from services.gateway.reading import Response
from services.gateway.relay import Conn, Traffic, Upstreams, open_tunnel
from services.gateway.upstream import UpstreamError
from services.gateway.wire import established


class Lease(Protocol):
    def __call__(
        self, caller: Caller, ask: Ask, *, exclude: frozenset[str], host: str
    ) -> Awaitable[Held]: ...


class Count(Protocol):
    def __call__(
        self,
        caller: Caller,
        held: Held,
        outcome: str,
        traffic: Traffic,
        *,
        tunnel: bool = False,
        host: str = "",
        status: int = 0,
    ) -> None: ...


@dataclass
class Tunnels:
    keeper: Keeper
    upstreams: Upstreams
    limits: Limits
    block_codes: tuple[int, ...]
    lease: Lease
    count: Count

    async def tunnel(self, caller: Caller, ask: Ask, target: Target, crawler: Crawler) -> None:
        exclude: frozenset[str] = frozenset()
        for attempt in range(2):
            held = await self.lease(caller, ask, exclude=exclude, host=target.host)
            opened = await self._connect(held, target)
            if isinstance(opened, str) or opened[1].status != 200:
                status = 0 if isinstance(opened, str) else opened[1].status
                why = opened if isinstance(opened, str) else f"the proxy answered {status}"
                if not isinstance(opened, str):
                    opened[0][1].close()
                outcome: Outcome = "blocked" if status in self.block_codes else "failed"
                self.keeper.report(held, outcome, target.host, why)
                self.count(
                    caller, held, outcome, Traffic(), tunnel=True, host=target.host, status=status
                )
                if attempt == 0 and ask.session is None:
                    exclude |= {held.granted.proxy_uid}
                    continue
                answer = 403 if status == 403 else 502
                raise Refusal(
                    heads.answer(answer, f"the tunnel through {held.proxy} failed: {why}")
                )
            (up_reader, up_writer), _ = opened
            crawler.write(established(held))
            await drain(crawler, self.limits.idle_timeout)
            held.in_flight += 1
            try:
                up, down = await pump_sides(
                    (crawler.transport, crawler.take_buffer(), crawler.eof),
                    stream_side((up_reader, up_writer)),
                    self.limits.idle_timeout,
                )
            finally:
                held.in_flight -= 1
                close(up_writer, self.limits.idle_timeout)
            self.count(
                caller,
                held,
                "success",
                Traffic(up, down),
                tunnel=True,
                host=target.host,
                status=200,
            )
            return

    async def _connect(self, held: Held, target: Target) -> tuple[Conn, Response] | str:
        for again in range(2):
            host, port, login = held.upstream()
            try:
                conn, response = await open_tunnel(
                    self.upstreams,
                    host,
                    port,
                    login,
                    target=target,
                    timeout=self.limits.answer_timeout,
                )
            except (UpstreamError, TimeoutError, HeadError) as exc:
                if again == 0:
                    await self.keeper.reread(held)
                    continue
                return str(exc) or "the proxy did not answer in time"
            if response.status == 407 and again == 0:
                conn[1].close()
                await self.keeper.reread(held)
                continue
            return conn, response
        return "the proxy refused the lease's login"
