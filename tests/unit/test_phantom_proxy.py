"""A proxy exists from its declaration: events on ``proxy.<uid>.*`` before a ``ProxyDeclared``
make no view, in the fold every reader shares
(docs/decisions/0095-the-console-and-the-api-bound.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from events import codec
from events.reading import apply_tolerantly, recorded
from events.schemas import (
    HealthChanged,
    InstanceCreated,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
)
from events.skips import UNUSABLE
from events.store import Recorded
from projections.proxy import ProxyView, Undeclared, apply, fold
from services.runtime.eventlog.asof import ByProxy, Stored

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STRAYS = [
    ("instance", InstanceCreated(command_id="c", provider="local", provider_id="i-1")),
    ("health", HealthChanged(healthy=True, reason="Probe", latency_ms=3.0)),
    ("status", PhaseChanged(phase=Phase.READY, reason="InstanceRunning", url="http://x:1")),
]


def rec(seq: int, category: str, event: object, uid: str = "ghost") -> Recorded:
    return Recorded(
        event=event,  # type: ignore[arg-type]
        seq=seq,
        subject=f"proxy.{uid}.{category}",
        timestamp=T0 + timedelta(seconds=seq),
    )


def declared(seq: int, uid: str = "ghost") -> Recorded:
    spec = ProxySpec(provider="local", attributes={"country": "de"})
    return rec(seq, "declared", ProxyDeclared(uid=uid, namespace="ns", name="late", spec=spec))


@pytest.mark.parametrize(("category", "event"), STRAYS)
def test_an_event_before_the_declaration_is_refused_by_the_fold(
    category: str, event: object
) -> None:
    with pytest.raises(Undeclared, match="no ProxyDeclared"):
        apply(None, rec(1, category, event))


@pytest.mark.parametrize(("category", "event"), STRAYS)
def test_the_tolerant_reader_skips_it_and_keeps_no_view(category: str, event: object) -> None:
    view, skip = apply_tolerantly(apply, None, rec(4, category, event), "PROXY")
    assert view is None
    assert skip is not None
    assert (skip.reason, skip.seq) == (UNUSABLE, 4)
    assert "no ProxyDeclared" in skip.detail


def test_an_unreadable_message_for_a_new_uid_makes_no_view_either() -> None:
    item, skip = recorded("PROXY", 2, "proxy.ghost.health", T0, b"{not json", {})
    assert skip is not None
    view, _ = apply_tolerantly(apply, None, item, "PROXY")
    assert view is None


def test_a_later_declaration_makes_the_proxy_as_if_the_strays_never_were() -> None:
    views = ByProxy(apply, "PROXY")
    for seq, (category, event) in enumerate(STRAYS, start=1):
        views.fold(Stored(rec(seq, category, event)))
    assert views.views == {}

    views.fold(Stored(declared(10)))
    views.fold(Stored(rec(11, "health", HealthChanged(healthy=False, reason="Probe"))))
    view = views.views["ghost"]
    assert (view.name, view.namespace, view.spec.provider) == ("late", "ns", "local")
    assert view.phase is Phase.PENDING  # the stray PhaseChanged(Ready) was not applied
    assert view.provider_id == ""
    assert view.healthy is False
    assert view.last_seq == 11


def test_an_aggregate_fold_skips_what_came_before_the_declaration() -> None:
    history = [rec(1, "health", HealthChanged(healthy=True)), declared(2)]
    view = fold(history)
    assert view is not None
    assert (view.name, view.healthy, view.last_seq) == ("late", None, 2)
    assert fold([rec(1, "health", HealthChanged(healthy=True))]) is None


def test_events_after_a_removal_still_fold_into_the_removed_view() -> None:
    """The rule is about the first declaration only: a removed proxy stays a known, removed one."""
    before = ProxyView(uid="ghost", name="late", removed=True, last_seq=5)
    after = apply(before, rec(6, "health", HealthChanged(healthy=True)))
    assert after.removed
    assert after.last_seq == 6


def test_the_skipped_event_is_a_normal_payload() -> None:
    """What a stray publish looks like on the wire decodes; only the fold refuses it."""
    data = codec.encode(HealthChanged(healthy=True))
    item, skip = recorded("PROXY", 3, "proxy.ghost.health", T0, data, {})
    assert skip is None
    with pytest.raises(Undeclared):
        apply(None, item)
