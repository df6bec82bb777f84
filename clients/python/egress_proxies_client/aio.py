"""The asyncio client, and the lease it keeps alive while a block of work runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Self

import httpx

from egress_proxies_client import _protocol as protocol
from egress_proxies_client.errors import EgressError, Unavailable, UnknownLease
from egress_proxies_client.models import Lease, Outcome, Rotation


class AsyncClient:
    """The discovery API at ``url``. ``holder`` names this client's leases (unique per client
    unless given), which ``list_mine``/``release_mine`` act on. Calls that fail for a reason that
    may pass (the API unreachable, ``503 unavailable``) are tried ``retries`` more times."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        holder: str | None = None,
        timeout: float = 10.0,
        retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.holder = holder or protocol.default_holder()
        self.timeout = timeout
        self.retries = retries
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # The API is reached directly: a crawler's environment often names a proxy for its
        # traffic (HTTP_PROXY), and the API must not be asked through it.
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers, trust_env=False, transport=transport
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, call: protocol.Call) -> Any:
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    call.method,
                    call.path,
                    json=call.body,
                    headers=dict(call.headers),
                    timeout=self.timeout + call.extra_timeout,
                )
            except httpx.TransportError as exc:
                sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                if attempt >= self.retries or (sent and not call.resend_safe):
                    raise protocol.unreachable(self.url, exc) from exc
                await asyncio.sleep(protocol.backoff(attempt))
            else:
                try:
                    return protocol.decode(
                        response.status_code, response.headers, response.content, self.url
                    )
                except Unavailable as exc:
                    if attempt >= self.retries:
                        raise
                    await asyncio.sleep(protocol.backoff(attempt, exc.retry_after))
            attempt += 1

    async def acquire(
        self,
        selector: Mapping[str, str] | None = None,
        ttl: float | None = None,
        *,
        target: str | None = None,
        wait: float | None = None,
        holder: str | None = None,
        exclude: Iterable[str] = (),
        proxy_uid: str | None = None,
        idempotency_key: str | None = None,
        pool: str | None = None,
    ) -> Lease:
        """A lease on a proxy whose attributes include ``selector`` and, with ``pool``
        (``"crawl/de"``), that is a member of that ProxyPool. Prefer ``lease()``, which renews
        and releases it. Every attempt of this call carries one ``Idempotency-Key``."""
        request = protocol.LeaseRequest(
            selector, ttl, target, wait, holder, tuple(exclude), proxy_uid, pool
        )
        return Lease.from_json(await self._call(request.call(self.holder, idempotency_key)))

    async def get(self, lease_id: str) -> Lease:
        return Lease.from_json(await self._call(protocol.get(lease_id)))

    async def renew(self, lease_id: str, ttl: float | None = None) -> Lease:
        return Lease.from_json(await self._call(protocol.renew(lease_id, ttl)))

    async def release(self, lease_id: str) -> None:
        await self._call(protocol.release(lease_id))

    async def report(
        self,
        lease_id: str,
        outcome: Outcome,
        *,
        target: str | None = None,
        detail: str | None = None,
    ) -> None:
        await self._call(protocol.report(lease_id, outcome, target, detail))

    async def rotate(
        self, lease_id: str, *, wait: bool = True, timeout: float = protocol.ROTATION_TIMEOUT
    ) -> Rotation:
        """Asks for a fresh instance (a fresh IP) of the lease's proxy, made and probed before
        the lease switches to it. With ``wait``, returns once the lease has switched
        (``rotation.lease`` has the new URL and fencing token); raises ``RotationFailed`` if it
        failed or was cancelled, ``TimeoutError`` if still under way after ``timeout`` seconds.
        The old instance is deleted a few seconds after the switch (the server's drain), so a
        holder must take the new URL at once: ``AsyncHeldLease.rotate`` does."""
        answer = Rotation.from_json(await self._call(protocol.rotate(lease_id)))
        if not wait:
            return answer
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not answer.over:
            left = deadline - loop.time()
            if left <= 0:
                raise protocol.not_over(answer, timeout)
            await asyncio.sleep(min(protocol.ROTATION_POLL, left))
            answer = await self.rotation(lease_id)
        return protocol.settled(answer)

    async def rotation(self, lease_id: str) -> Rotation:
        """The lease's latest rotation; an ``EgressError`` with code ``no_rotation`` if it never
        asked for one."""
        return Rotation.from_json(await self._call(protocol.rotation(lease_id)))

    async def list_mine(
        self, holder: str | None = None, *, page_size: int = protocol.LIST_PAGE
    ) -> list[Lease]:
        """Every active lease of ``holder`` (the client's by default), oldest first, fetched
        ``page_size`` (1 to 1000) at a time, following ``continue``: a holder of thousands
        never gets one huge answer."""
        found: list[Lease] = []
        token = ""
        while True:
            answer = await self._call(protocol.list_holder(holder or self.holder, token, page_size))
            found += [Lease.from_json(item) for item in answer["items"]]
            token = protocol.next_page(answer)
            if not token:
                return found

    async def release_mine(self, holder: str | None = None) -> int:
        """Releases every active lease of the holder (this client's by default), e.g. after a
        crash left some behind; how many this call released."""
        answer = await self._call(protocol.release_holder(holder or self.holder))
        return int(answer["released"])

    def lease(
        self,
        selector: Mapping[str, str] | None = None,
        ttl: float | None = None,
        *,
        target: str | None = None,
        wait: float | None = None,
        holder: str | None = None,
        exclude: Iterable[str] = (),
        proxy_uid: str | None = None,
        pool: str | None = None,
    ) -> AsyncHeldLease:
        """``async with client.lease({"country": "de"}, 60, target="shop.example") as lease``:
        acquired on entry, renewed in the background, released on exit (also on an exception)."""
        return AsyncHeldLease(
            self,
            protocol.LeaseRequest(
                selector, ttl, target, wait, holder, tuple(exclude), proxy_uid, pool
            ),
        )


class AsyncHeldLease(protocol.HeldLeaseBase):
    """A lease while it is held. ``proxy`` (and ``url``) are those of the latest answer, acquire,
    renewal or rotation: the proxy URL may carry credentials that change on renewal, and a
    rotation moves it to a new instance, so read ``lease.url`` for each request. ``lost`` is set
    when a renewal finds the lease gone."""

    _OPEN_WITH = "async with client.lease()"

    def __init__(self, client: AsyncClient, request: protocol.LeaseRequest) -> None:
        super().__init__(request)
        self._client = client
        self._renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def open(self) -> Self:
        """Acquires the lease and starts renewing it; ``async with`` calls this."""
        call = self._acquire(self._client.holder)
        self._lease = Lease.from_json(await self._client._call(call))
        self._renewer = asyncio.create_task(self._renew(), name=f"renew {self._lease.id}")
        return self

    async def renew(self, ttl: float | None = None) -> Lease:
        """Renews now (the background renewal needs no help); the new answer is kept."""
        answer = await self._client.renew(self.id, ttl or self._request.ttl)
        self._lease = protocol.newer(self._lease, answer)
        return self._lease

    async def rotate(self, timeout: float = protocol.ROTATION_TIMEOUT) -> Rotation:
        """A fresh instance (a fresh IP) without downtime: returns once the lease has switched
        to it, with ``url``, ``proxy`` and ``lease.fencing_token`` already the new ones, well
        before the old instance is deleted. Requests sent through the old URL meanwhile still
        succeed. ``RotationFailed`` (the lease stays on its instance, still held) or
        ``TimeoutError`` otherwise; see ``AsyncClient.rotate``."""
        rotation = await self._client.rotate(self.id, wait=True, timeout=timeout)
        self._lease = protocol.newer(self._lease, rotation.lease)
        return rotation

    async def report_success(self, target: str | None = None, detail: str | None = None) -> None:
        await self._report("success", target, detail)

    async def report_blocked(self, target: str | None = None, detail: str | None = None) -> None:
        """The target refused the proxy's address: the API then keeps this proxy from that
        target for a while (docs/api.md, "Outcomes")."""
        await self._report("blocked", target, detail)

    async def report_failed(self, target: str | None = None, detail: str | None = None) -> None:
        await self._report("failed", target, detail)

    async def _report(self, outcome: Outcome, target: str | None, detail: str | None) -> None:
        await self._client.report(self.id, outcome, target=target or self.target, detail=detail)

    async def close(self) -> None:
        """Stops renewing and releases the lease; a lease already over is no error. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._renewer is not None:
            self._renewer.cancel()
            # Whatever ended the renewal, the lease is still released.
            await asyncio.gather(self._renewer, return_exceptions=True)
        if self._lease is not None and self.lost is None:
            with contextlib.suppress(UnknownLease):
                await self._client.release(self._lease.id)

    async def _renew(self) -> None:
        loop = asyncio.get_running_loop()
        ttl = self._request.ttl
        answered = loop.time()
        while True:
            end = answered + self.lease.ttl_seconds
            await asyncio.sleep(protocol.renew_delay(self.lease.ttl_seconds))
            while True:
                try:
                    answer = await self._client.renew(self.id, ttl)
                except UnknownLease as exc:
                    self.lost = exc
                    return
                except EgressError as exc:
                    if loop.time() >= end:
                        self.lost = exc
                        return
                    pause = exc.retry_after if isinstance(exc, Unavailable) else 1.0
                    await asyncio.sleep(min(pause, max(end - loop.time(), 0.0) / 3 + 0.05))
                    continue
                self._lease = protocol.newer(self._lease, answer)
                answered = loop.time()
                break
