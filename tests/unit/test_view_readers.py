"""What the health prober and discovery read from the shared proxy view: the verdict on record
and whom it judged, and the latency the API shows. Pure, no servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from events.schemas import (
    AnyEvent,
    CreateInstance,
    HealthChanged,
    InstanceCreated,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
)
from events.store import Recorded
from projections.proxy import ProxyView, apply
from services.discovery.http.models import probe_latency
from services.health.pure.verdict import Known
from services.health.scheduler import known, probed

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def view_after(*events: AnyEvent) -> ProxyView:
    view: ProxyView | None = None
    history: list[AnyEvent] = [
        ProxyDeclared(uid="u1", namespace="n", name="a", spec=ProxySpec(provider="p")),
        InstanceCreated(command_id="c1", provider="p", provider_id="i-1"),
        PhaseChanged(phase=Phase.READY, url="http://10.0.0.1:3128", provider_id="i-1"),
        *events,
    ]
    for seq, event in enumerate(history, start=1):
        recorded = Recorded(event, seq, f"proxy.u1.{event.category}", T0 + timedelta(seconds=seq))
        view = apply(view, recorded)
    assert view is not None
    return view


def test_the_verdict_on_the_current_instance_is_known() -> None:
    view = view_after(HealthChanged(healthy=True, latency_ms=12.5, provider_id="i-1"))
    assert probed(view)
    assert known(view) == Known(True, 12.5)
    assert probe_latency(view) == 12.5


def test_nothing_is_known_before_a_verdict() -> None:
    view = view_after()
    assert known(view) == Known()
    assert probe_latency(view) is None


def test_a_replacement_starts_over() -> None:
    view = view_after(
        HealthChanged(healthy=True, latency_ms=12.5, provider_id="i-1"),
        CreateInstance(command_id="c2", provider="p", instance_name="n2", spec=ProxySpec()),
        InstanceCreated(command_id="c2", provider="p", provider_id="i-2"),
    )
    assert known(view) == Known()
    # The API goes on showing the last healthy verdict's latency until a new verdict.
    assert probe_latency(view) == 12.5


def test_a_verdict_about_a_replaced_instance_is_not_known() -> None:
    view = view_after(
        HealthChanged(healthy=True, latency_ms=12.5, provider_id="i-1"),
        HealthChanged(healthy=False, provider_id="i-0"),
    )
    assert view.healthy is True  # the view does not count it ...
    assert known(view) == Known()  # ... and the prober judges afresh


def test_an_unhealthy_verdict_shows_no_latency() -> None:
    view = view_after(HealthChanged(healthy=False, latency_ms=30.0, provider_id="i-1"))
    assert known(view) == Known(False, 30.0)
    assert probe_latency(view) is None
