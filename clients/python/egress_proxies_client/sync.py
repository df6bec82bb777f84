"""The blocking client, for scripts and thread-based crawlers; the same API as ``AsyncClient``.

It runs on ``httpx.Client``, not on an event loop in a thread. A held lease is renewed by one
daemon thread of its own, which shares the client's connection pool (httpx's sync client is safe
to use from several threads).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Self

import httpx

from egress_proxies_client import _protocol as protocol
from egress_proxies_client.errors import EgressError, Unavailable, UnknownLease
from egress_proxies_client.models import Lease, Outcome, Rotation


class Client:
    """The discovery API at ``url``; see ``AsyncClient`` for the arguments."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        holder: str | None = None,
        timeout: float = 10.0,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.holder = holder or protocol.default_holder()
        self.timeout = timeout
        self.retries = retries
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.url, headers=headers, trust_env=False, transport=transport
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, call: protocol.Call) -> Any:
        attempt = 0
        while True:
            try:
                response = self._http.request(
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
                time.sleep(protocol.backoff(attempt))
            else:
                try:
                    return protocol.decode(
                        response.status_code, response.headers, response.content, self.url
                    )
                except Unavailable as exc:
                    if attempt >= self.retries:
                        raise
                    time.sleep(protocol.backoff(attempt, exc.retry_after))
            attempt += 1

    def acquire(
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
        request = protocol.LeaseRequest(
            selector, ttl, target, wait, holder, tuple(exclude), proxy_uid, pool
        )
        return Lease.from_json(self._call(request.call(self.holder, idempotency_key)))

    def get(self, lease_id: str) -> Lease:
        return Lease.from_json(self._call(protocol.get(lease_id)))

    def renew(self, lease_id: str, ttl: float | None = None) -> Lease:
        return Lease.from_json(self._call(protocol.renew(lease_id, ttl)))

    def release(self, lease_id: str) -> None:
        self._call(protocol.release(lease_id))

    def report(
        self,
        lease_id: str,
        outcome: Outcome,
        *,
        target: str | None = None,
        detail: str | None = None,
    ) -> None:
        self._call(protocol.report(lease_id, outcome, target, detail))

    def rotate(
        self, lease_id: str, *, wait: bool = True, timeout: float = protocol.ROTATION_TIMEOUT
    ) -> Rotation:
        """See ``AsyncClient.rotate``."""
        answer = Rotation.from_json(self._call(protocol.rotate(lease_id)))
        if not wait:
            return answer
        deadline = time.monotonic() + timeout
        while not answer.over:
            left = deadline - time.monotonic()
            if left <= 0:
                raise protocol.not_over(answer, timeout)
            time.sleep(min(protocol.ROTATION_POLL, left))
            answer = self.rotation(lease_id)
        return protocol.settled(answer)

    def rotation(self, lease_id: str) -> Rotation:
        return Rotation.from_json(self._call(protocol.rotation(lease_id)))

    def list_mine(
        self, holder: str | None = None, *, page_size: int = protocol.LIST_PAGE
    ) -> list[Lease]:
        """Every active lease of ``holder`` (the client's by default), oldest first, fetched
        ``page_size`` (1 to 1000) at a time, following ``continue``: a holder of thousands
        never gets one huge answer."""
        found: list[Lease] = []
        token = ""
        while True:
            answer = self._call(protocol.list_holder(holder or self.holder, token, page_size))
            found += [Lease.from_json(item) for item in answer["items"]]
            token = protocol.next_page(answer)
            if not token:
                return found

    def release_mine(self, holder: str | None = None) -> int:
        return int(self._call(protocol.release_holder(holder or self.holder))["released"])

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
    ) -> HeldLease:
        """``with client.lease(...) as lease``: acquired on entry, renewed by a background
        thread, released on exit (also on an exception)."""
        return HeldLease(
            self,
            protocol.LeaseRequest(
                selector, ttl, target, wait, holder, tuple(exclude), proxy_uid, pool
            ),
        )


class HeldLease(protocol.HeldLeaseBase):
    """A lease while it is held; see ``AsyncHeldLease``. Read ``url`` for each request."""

    def __init__(self, client: Client, request: protocol.LeaseRequest) -> None:
        super().__init__(request)
        self._client = client
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._keeping = threading.Lock()
        """The renewal thread and the caller's ``rotate`` both keep answers (``_keep``)."""

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def open(self) -> Self:
        call = self._acquire(self._client.holder)
        self._lease = Lease.from_json(self._client._call(call))
        self._renewer = threading.Thread(
            target=self._renew, name=f"renew {self._lease.id}", daemon=True
        )
        self._renewer.start()
        return self

    def renew(self, ttl: float | None = None) -> Lease:
        return self._keep(self._client.renew(self.id, ttl or self._request.ttl))

    def rotate(self, timeout: float = protocol.ROTATION_TIMEOUT) -> Rotation:
        """See ``AsyncHeldLease.rotate``."""
        rotation = self._client.rotate(self.id, wait=True, timeout=timeout)
        self._keep(rotation.lease)
        return rotation

    def _keep(self, answer: Lease) -> Lease:
        with self._keeping:
            self._lease = protocol.newer(self._lease, answer)
            return self._lease

    def report_success(self, target: str | None = None, detail: str | None = None) -> None:
        self._report("success", target, detail)

    def report_blocked(self, target: str | None = None, detail: str | None = None) -> None:
        self._report("blocked", target, detail)

    def report_failed(self, target: str | None = None, detail: str | None = None) -> None:
        self._report("failed", target, detail)

    def _report(self, outcome: Outcome, target: str | None, detail: str | None) -> None:
        self._client.report(self.id, outcome, target=target or self.target, detail=detail)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self._lease is not None and self.lost is None:
            with contextlib.suppress(UnknownLease):
                self._client.release(self._lease.id)

    def _renew(self) -> None:
        ttl = self._request.ttl
        answered = time.monotonic()
        while not self._stop.wait(protocol.renew_delay(self.lease.ttl_seconds)):
            end = answered + self.lease.ttl_seconds
            while not self._stop.is_set():
                try:
                    answer = self._client.renew(self.id, ttl)
                except UnknownLease as exc:
                    self.lost = exc
                    return
                except EgressError as exc:
                    if time.monotonic() >= end:
                        self.lost = exc
                        return
                    pause = exc.retry_after if isinstance(exc, Unavailable) else 1.0
                    self._stop.wait(min(pause, max(end - time.monotonic(), 0.0) / 3 + 0.05))
                    continue
                self._keep(answer)
                answered = time.monotonic()
                break
