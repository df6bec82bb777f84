"""Proxy views with egress findings, folded from events by the real proxy fold, for the tests of
what the pages, the API and the CLI show of a proxy's egress."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from events.egress import EgressObserved
from events.schemas import (
    Event,
    HealthChanged,
    InstanceCreated,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
)
from events.spec import Egress, EgressExpect
from events.store import Recorded
from projections.proxy import ProxyView, apply

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


def spec(
    country: str = "", asn: tuple[int, ...] = (), provider: str = "local", **attributes: str
) -> ProxySpec:
    """A spec expecting ``country`` and ``asn`` of its egress (none: no expectation)."""
    return ProxySpec(
        provider=provider,
        attributes=attributes,
        egress=Egress(expect=EgressExpect(country=country, asn=asn)),
    )


def seen(
    ip: str,
    country: str = "DE",
    asn: int = 3320,
    org: str = "Deutsche Telekom AG",
    pid: str = "i-1",
    **fields: object,
) -> EgressObserved:
    checked = fields.pop("checked_at", T0 + timedelta(minutes=1))
    return EgressObserved(
        provider_id=pid,
        ip=ip,
        scope=str(fields.pop("scope", "public")),
        country=country,
        asn=asn,
        org=org,
        db=str(fields.pop("db", "GeoLite2-Country 2026-11-28")),
        checked_at=checked,  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
    )


def ready(uid: str, *events: Event, proxy_spec: ProxySpec | None = None, seq: int = 0) -> ProxyView:
    """A declared, Ready, healthy proxy on instance ``i-1``, then ``events``; its sequences start
    after ``seq`` (of two proxies on one address, the later is the one with higher ones)."""
    declared = ProxyDeclared(
        uid=uid, namespace="crawl", name=uid, spec=proxy_spec or spec(provider="local")
    )
    created = InstanceCreated(command_id=f"c-{uid}", provider="local", provider_id="i-1")
    up = PhaseChanged(
        phase=Phase.READY,
        reason="InstanceRunning",
        ip="10.0.0.1",
        url="http://10.0.0.1:3128",
        provider_id="i-1",
    )
    healthy = HealthChanged(healthy=True, latency_ms=9.0, provider_id="i-1")
    view: ProxyView | None = None
    for n, event in enumerate((declared, created, up, healthy, *events), start=seq + 1):
        at = T0 + timedelta(seconds=n)
        view = apply(view, Recorded(event, n, f"proxy.{uid}.{event.category}", at))  # type: ignore[arg-type]
    assert view is not None
    return view
