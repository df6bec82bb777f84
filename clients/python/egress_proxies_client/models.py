"""The API's lease resource as typed, immutable values.

Decoding is lenient about what it does not use: a field a newer server adds is ignored, so a
crawler does not break when the service is upgraded before it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

Outcome = Literal["success", "blocked", "failed"]


@dataclass(frozen=True, slots=True)
class Proxy:
    uid: str
    namespace: str
    name: str
    url: str
    """Where to send traffic. It may carry credentials that change when the lease is renewed, so
    read it from the lease for every request rather than keeping a copy."""
    ip: str
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Report:
    outcome: str
    target: str
    detail: str
    at: datetime


@dataclass(frozen=True, slots=True)
class Lease:
    """One answer about a lease: what the server said at acquire, renewal or ``get``."""

    id: str
    proxy: Proxy
    acquired_at: datetime
    expires_at: datetime
    fencing_token: int
    """Strictly increasing per proxy but not consecutive: compare tokens, never count them."""
    ttl_seconds: float
    """The TTL granted, which may be less than asked (``ttl_clamped``)."""
    ttl_clamped: bool
    holder: str
    selector: Mapping[str, str]
    reports: tuple[Report, ...] = ()
    renewed_at: datetime | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Lease:
        proxy = data["proxy"]
        return cls(
            id=str(data["id"]),
            proxy=Proxy(
                uid=str(proxy["uid"]),
                namespace=str(proxy.get("namespace", "")),
                name=str(proxy.get("name", "")),
                url=str(proxy["url"]),
                ip=str(proxy.get("ip", "")),
                attributes=dict(proxy.get("attributes") or {}),
            ),
            acquired_at=_time(data["acquiredAt"]),
            expires_at=_time(data["expiresAt"]),
            fencing_token=int(data["fencingToken"]),
            ttl_seconds=float(data["ttlSeconds"]),
            ttl_clamped=bool(data.get("ttlClamped", False)),
            holder=str(data.get("holder") or ""),
            selector=dict(data.get("selector") or {}),
            reports=tuple(
                Report(
                    outcome=str(item["outcome"]),
                    target=str(item.get("target", "")),
                    detail=str(item.get("detail", "")),
                    at=_time(item["at"]),
                )
                for item in data.get("outcomes") or ()
            ),
            renewed_at=_time(data["renewedAt"]) if data.get("renewedAt") else None,
        )


@dataclass(frozen=True, slots=True)
class Rotation:
    """A fresh instance (a fresh IP) of a lease's proxy, made before the old one is deleted
    (docs/api.md, "POST /v1/leases/{id}/rotate"): what the server said about it."""

    id: str
    state: str
    """``requested``, ``creating``, ``probing``, ``switching`` (under way), then ``completed``
    (the lease has switched: ``lease`` has the new URL and fencing token), ``failed`` or
    ``cancelled`` (the lease stays on its instance; ``message`` says why)."""
    reason: str
    message: str
    lease: Lease
    """The lease as it was when the server answered."""
    requested_at: datetime | None = None
    ended_at: datetime | None = None

    @property
    def over(self) -> bool:
        return self.state in ("completed", "failed", "cancelled")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rotation:
        return cls(
            id=str(data["rotationId"]),
            state=str(data["state"]),
            reason=str(data.get("reason") or ""),
            message=str(data.get("message") or ""),
            lease=Lease.from_json(data["lease"]),
            requested_at=_time(data["requestedAt"]) if data.get("requestedAt") else None,
            ended_at=_time(data["endedAt"]) if data.get("endedAt") else None,
        )


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)
