"""What the API accepts and answers, as msgspec Structs (Litestar validates and documents them)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec
from msgspec import Meta

from projections.lease import LeaseRecord, LeaseView, available_at, is_available, is_free
from projections.lease import state_of as lease_state
from projections.proxy import ProxyView

AttributeKey = Annotated[str, Meta(min_length=1, max_length=63)]
AttributeValue = Annotated[str, Meta(max_length=256)]
Selector = dict[AttributeKey, AttributeValue]


class AcquireRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    selector: Selector = msgspec.field(default_factory=dict)
    """Attributes the proxy must have, all of them (``{"country": "de"}``)."""
    ttl_seconds: Annotated[float, Meta(gt=0, le=86400 * 7)] | None = None
    """How long the lease lasts unless released; at most the server's maximum (default 300 s,
    or the maximum if lower)."""
    holder: Annotated[str, Meta(max_length=256)] = ""
    """Who holds the lease (a crawler's name), shown in the log and in the lease."""


class ReportRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    outcome: Annotated[str, Meta(pattern="^[a-z][a-z0-9_-]{0,31}$")]
    """``success``, ``failure``, ``blocked``, ``captcha``, ``timeout``, ``error``, or another
    short lowercase word."""
    detail: Annotated[str, Meta(max_length=1024)] = ""


class ProxyOut(msgspec.Struct, frozen=True, kw_only=True):
    uid: str
    namespace: str
    name: str
    phase: str
    url: str
    ip: str
    provider: str
    healthy: bool | None
    """None until a health prober has reported on the proxy."""
    attributes: dict[str, str]
    leased: bool
    """A lease holds the proxy now."""
    available: bool
    """It could be leased now: Ready, not unhealthy, not leased, not cooling down."""
    lease_expires_at: datetime | None
    cooldown_until: datetime | None
    fencing_token: int
    """The token of the newest lease on this proxy (0: never leased)."""


class ProxyList(msgspec.Struct, frozen=True, kw_only=True):
    items: list[ProxyOut]


class LeasedProxy(msgspec.Struct, frozen=True, kw_only=True):
    uid: str
    namespace: str
    name: str
    url: str
    """Where the holder sends its traffic (``http://ip:port``)."""
    ip: str
    attributes: dict[str, str]


class OutcomeOut(msgspec.Struct, frozen=True, kw_only=True):
    outcome: str
    detail: str
    at: datetime


class LeaseOut(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    state: str
    """``active``, ``released`` or ``expired``."""
    holder: str
    proxy: LeasedProxy
    acquired_at: datetime
    expires_at: datetime
    ttl_seconds: float
    fencing_token: int
    """Strictly increasing per proxy: a downstream system can refuse a holder whose token is
    lower than one it has already seen."""
    selector: dict[str, str]
    ended_at: datetime | None
    cooldown_until: datetime | None
    """When the proxy can be leased again, once this lease has ended."""
    outcomes: list[OutcomeOut]


class Health(msgspec.Struct, frozen=True, kw_only=True):
    status: str


def proxy_out(
    proxy: ProxyView, view: LeaseView | None, now: datetime, *, eligible: bool
) -> ProxyOut:
    leased = not is_free(view, now)
    return ProxyOut(
        uid=proxy.uid,
        namespace=proxy.namespace,
        name=proxy.name,
        phase=str(proxy.phase),
        url=proxy.url,
        ip=proxy.ip,
        provider=proxy.spec.provider,
        healthy=proxy.healthy,
        attributes=dict(proxy.spec.attributes),
        leased=leased,
        available=eligible and is_available(view, now),
        lease_expires_at=view.expires_at if leased and view is not None else None,
        cooldown_until=_cooldown(view, now),
        fencing_token=view.fencing_token if view is not None else 0,
    )


def _cooldown(view: LeaseView | None, now: datetime) -> datetime | None:
    when = available_at(view)
    if when is None or when <= now or (view is not None and not is_free(view, now)):
        return None
    return when


def lease_out(
    record: LeaseRecord, view: LeaseView, proxy: ProxyView | None, now: datetime
) -> LeaseOut:
    state = lease_state(record, now)
    cooldown: datetime | None = None
    if record is view.current:
        cooldown = available_at(view) if state != "active" else None
    elif view.recent and record is view.recent[-1]:
        cooldown = view.cooldown_until
    return LeaseOut(
        id=record.lease_id,
        state=state,
        holder=record.holder,
        proxy=LeasedProxy(
            uid=record.proxy_uid,
            namespace=proxy.namespace if proxy else "",
            name=proxy.name if proxy else "",
            url=proxy.url if proxy else "",
            ip=proxy.ip if proxy else "",
            attributes=dict(proxy.spec.attributes) if proxy else {},
        ),
        acquired_at=record.acquired_at,
        expires_at=record.expires_at,
        ttl_seconds=record.ttl_seconds,
        fencing_token=record.fencing_token,
        selector=dict(record.selector),
        ended_at=record.ended_at or (record.expires_at if state == "expired" else None),
        cooldown_until=cooldown,
        outcomes=[OutcomeOut(outcome=o.outcome, detail=o.detail, at=o.at) for o in record.outcomes],
    )
