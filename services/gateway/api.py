"""The discovery API as the gateway calls it: on behalf of a client, with that client's token.

The gateway holds no power of its own over the fleet. Every lease it takes is taken with the
crawler's bearer token, so the crawler's scopes, selectors and ``maxLeases`` apply unchanged
(docs/api.md, "Clients"), and the log names the crawler as the lease's client. Errors of the
HTTP client are wrapped in ``ApiError``, chained, so the gateway's shell handles one hierarchy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from services.gateway.pure.outcomes import Outcome

TIMEOUT = 10.0


class ApiError(Exception):
    """The API refused or could not be reached. ``status`` 0: no answer at all."""

    def __init__(self, message: str, *, status: int = 0, code: str = "", retry_after: float = 0.0):
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Granted:
    """What the gateway needs of a lease answer."""

    lease_id: str
    proxy_uid: str
    proxy: str
    """``namespace/name``, for logs, metrics and the ``X-Egress-Proxy`` header."""
    url: str
    """The proxy URL with the lease's credentials (they change with each renewal)."""
    ttl: float
    expires_at: datetime

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Granted:
        try:
            proxy = data["proxy"]
            return cls(
                lease_id=str(data["id"]),
                proxy_uid=str(proxy["uid"]),
                proxy=f"{proxy.get('namespace', '')}/{proxy.get('name', '')}",
                url=str(proxy["url"]),
                ttl=float(data["ttlSeconds"]),
                expires_at=datetime.fromisoformat(str(data["expiresAt"])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ApiError(f"the discovery API's lease answer cannot be read: {exc!r}") from exc


class Api:
    def __init__(self, url: str, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        # Never through a proxy from the environment: the API is ours, reached directly.
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"), trust_env=False, timeout=TIMEOUT, transport=transport
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def acquire(
        self,
        token: str | None,
        *,
        holder: str,
        selector: Mapping[str, str],
        pool: str | None,
        ttl: float,
        key: str | None = None,
        exclude: Sequence[str] = (),
        proxy_uid: str | None = None,
        target: str | None = None,
    ) -> Granted:
        body: dict[str, Any] = {"selector": dict(selector), "ttlSeconds": ttl, "holder": holder}
        if pool is not None:
            body["pool"] = pool
        if exclude:
            body["exclude"] = list(exclude)
        if proxy_uid is not None:
            body["proxyUid"] = proxy_uid
        if target is not None:
            body["target"] = target
        headers = {"Idempotency-Key": key} if key else {}
        return Granted.of(await self._call("POST", "/v1/leases", token, body, headers=headers))

    async def get(self, token: str | None, lease_id: str) -> Granted:
        return Granted.of(await self._call("GET", f"/v1/leases/{quote(lease_id)}", token))

    async def renew(self, token: str | None, lease_id: str, ttl: float) -> Granted:
        path = f"/v1/leases/{quote(lease_id)}"
        return Granted.of(await self._call("PATCH", path, token, {"ttlSeconds": ttl}))

    async def release(self, token: str | None, lease_id: str) -> None:
        await self._call("DELETE", f"/v1/leases/{quote(lease_id)}", token)

    async def report(
        self, token: str | None, lease_id: str, outcome: Outcome, target: str, detail: str
    ) -> None:
        body = {"outcome": outcome, "detail": detail[:1024]}
        if target:
            body["target"] = target
        await self._call("POST", f"/v1/leases/{quote(lease_id)}/report", token, body)

    async def holding(self, token: str | None, holder: str) -> list[Granted]:
        """The client's active leases of ``holder``, oldest first (first page only: a gateway
        holder has one lease, or a few)."""
        answer = await self._call("GET", "/v1/leases", token, params={"holder": holder})
        return [Granted.of(item) for item in answer.get("items", ())]

    async def _call(
        self,
        method: str,
        path: str,
        token: str | None,
        body: Mapping[str, Any] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        sent = dict(headers or {})
        if token:
            sent["Authorization"] = f"Bearer {token}"
        try:
            answer = await self._http.request(method, path, json=body, headers=sent, params=params)
        except httpx.HTTPError as exc:
            raise ApiError(f"the discovery API did not answer: {exc!r}") from exc
        if answer.status_code >= 400:
            raise _refusal(answer)
        if answer.status_code == 204 or not answer.content:
            return {}
        try:
            return answer.json()
        except ValueError as exc:
            raise ApiError("the discovery API answered something not JSON") from exc


def _refusal(answer: httpx.Response) -> ApiError:
    try:
        data = answer.json()
    except ValueError:
        data = {}
    code = str(data.get("error", "")) if isinstance(data, dict) else ""
    message = str(data.get("message", "")) if isinstance(data, dict) else ""
    retry = _retry_after(answer.headers.get("retry-after", ""))
    return ApiError(
        message or f"HTTP {answer.status_code}",
        status=answer.status_code,
        code=code,
        retry_after=retry,
    )


def _retry_after(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) and 0 <= value <= 3600 else 0.0
