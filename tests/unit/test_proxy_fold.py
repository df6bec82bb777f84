"""The proxy view fold, without servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from events.schemas import (
    Condition,
    HealthChanged,
    InstanceCreated,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyRemoved,
    ProxySpec,
    ProxySpecChanged,
)
from events.store import Recorded
from projections.proxy import apply, fold

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rec(seq: int, category: str, event: object) -> Recorded:
    return Recorded(
        event=event,  # type: ignore[arg-type]
        seq=seq,
        subject=f"proxy.u1.{category}",
        timestamp=T0 + timedelta(seconds=seq),
    )


def story() -> list[Recorded]:
    spec = ProxySpec(provider="local", attributes={"country": "de"})
    return [
        rec(1, "declared", ProxyDeclared(uid="u1", namespace="ns", name="p1", spec=spec)),
        rec(2, "status", PhaseChanged(phase=Phase.PROVISIONING, reason="Creating")),
        rec(3, "instance", InstanceCreated(command_id="c1", provider="local", provider_id="i-1")),
        rec(
            4,
            "status",
            PhaseChanged(
                phase=Phase.READY,
                reason="InstanceRunning",
                ip="127.0.0.1",
                url="http://127.0.0.1:3128",
                observed_generation=1,
                conditions=(Condition(type="Ready", status="True", reason="InstanceRunning"),),
            ),
        ),
        rec(5, "health", HealthChanged(healthy=True)),
    ]


def test_story_of_a_ready_proxy() -> None:
    view = fold(story())
    assert view is not None
    assert (view.uid, view.namespace, view.name) == ("u1", "ns", "p1")
    assert view.phase is Phase.READY
    assert view.url == "http://127.0.0.1:3128"
    assert view.provider_id == "i-1"
    assert view.healthy is True
    assert view.conditions[0].type == "Ready"
    assert view.created_at == T0 + timedelta(seconds=1)
    assert view.updated_at == T0 + timedelta(seconds=5)
    assert view.last_seq == 5


def test_spec_change_and_deletion() -> None:
    events = [
        *story(),
        rec(
            6, "declared", ProxySpecChanged(uid="u1", spec=ProxySpec(provider="gcp"), generation=2)
        ),
        rec(7, "declared", ProxyDeletionRequested(uid="u1")),
    ]
    view = fold(events)
    assert view is not None
    assert view.spec.provider == "gcp"
    assert view.generation == 2
    assert view.deleting
    assert not view.removed
    removed = apply(view, rec(8, "declared", ProxyRemoved(uid="u1")))
    assert removed.removed


def test_fold_is_deterministic_and_incremental() -> None:
    events = story()
    whole = fold(events)
    partial = fold(events[:2])
    for r in events[2:]:
        partial = apply(partial, r)
    assert whole == partial
