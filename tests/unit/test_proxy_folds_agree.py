"""One PROXY stream, two folds: the proxy view (``projections.proxy``), which the API, the
status writer and discovery read, and the reconciler's view (``services.reconciler.pure.view``),
which it decides on. Over any history the log can hold, hostile ones included, the facts both
keep agree (docs/decisions/0146-one-proxy-history-two-folds-held-together.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from events.egress import EgressObserved
from events.reading import apply_tolerantly
from events.rotation import (
    ReplacementPromoted,
    ReplacementStarted,
    RotationEnded,
    RotationRequested,
)
from events.schemas import (
    CreateInstance,
    DeleteInstance,
    ErrorClass,
    Event,
    HealthChanged,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    ObserveInstance,
    Phase,
    PhaseChanged,
    ProviderFailed,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyRemoved,
    ProxySpec,
    ProxySpecChanged,
)
from events.skips import UNDECODABLE
from events.store import Recorded, Unreadable
from projections import proxy
from services.reconciler.pure.view import ProxyState, fold

UID = "0b5e8f8e-1111-4222-8333-944455556666"
T0 = datetime(2026, 1, 1, tzinfo=UTC)

# Few values of each id, so that generated answers meet the commands and instances they name.
commands = st.sampled_from(["c-1", "c-2", "c-3"])
instances = st.sampled_from(["", "i-1", "i-2", "i-3"])
rotations = st.sampled_from(["r-1", "r-2"])
words = st.sampled_from(["", "a", "b"])
specs = st.builds(ProxySpec, provider=st.sampled_from(["local", "hetzner"]))
generations = st.integers(-1, 4)

history_events = st.one_of(
    st.builds(
        ProxyDeclared,
        uid=st.just(UID),
        namespace=words,
        name=words,
        spec=specs,
        generation=generations,
        source=st.sampled_from(["cli", "kubernetes"]),
        cloud_init_resolved=words,
    ),
    st.builds(
        ProxySpecChanged,
        uid=st.just(UID),
        spec=specs,
        generation=generations,
        cloud_init_resolved=words,
    ),
    st.builds(ProxyDeletionRequested, uid=st.just(UID)),
    st.builds(ProxyRemoved, uid=st.just(UID)),
    st.builds(
        CreateInstance,
        command_id=commands,
        provider=words,
        instance_name=words,
        spec=specs,
        spec_hash=words,
    ),
    st.builds(DeleteInstance, command_id=commands, provider=words, provider_id=instances),
    st.builds(ObserveInstance, command_id=commands, provider=words, provider_id=instances),
    st.builds(InstanceCreated, command_id=commands, provider=words, provider_id=instances),
    st.builds(
        InstanceObserved,
        command_id=commands,
        provider=words,
        provider_id=instances,
        state=st.sampled_from(InstanceState),
        ip=words,
        url=words,
    ),
    st.builds(InstanceGone, command_id=commands, provider=words, provider_id=instances),
    st.builds(
        ProviderFailed,
        command_id=commands,
        provider=words,
        operation=st.sampled_from(["create", "delete", "observe"]),
        error_class=st.sampled_from(ErrorClass),
        message=words,
        provider_id=instances,
    ),
    st.builds(
        HealthChanged,
        healthy=st.booleans(),
        reason=words,
        message=words,
        latency_ms=st.sampled_from([0.0, 12.5]),
        provider_id=instances,
    ),
    st.builds(EgressObserved, provider_id=instances, ip=words),
    st.builds(
        PhaseChanged,
        phase=st.sampled_from(Phase),
        reason=words,
        message=words,
        ip=words,
        url=words,
        provider_id=instances,
        observed_generation=generations,
    ),
    st.builds(RotationRequested, uid=st.just(UID), rotation_id=rotations, lease_id=words),
    st.builds(ReplacementStarted, rotation_id=rotations, command_id=commands, lease_id=words),
    st.builds(
        ReplacementPromoted,
        rotation_id=rotations,
        provider_id=instances,
        ip=words,
        url=words,
    ),
    st.builds(
        RotationEnded,
        rotation_id=rotations,
        outcome=st.sampled_from(["failed", "cancelled"]),
        message=words,
    ),
    st.builds(Unreadable, type=words, reason=st.just(UNDECODABLE), detail=words),
)


def recorded(log: list[Event | Unreadable]) -> list[Recorded]:
    """The events as the log would hold them, the same event possibly twice (a duplicate)."""
    return [
        Recorded(
            event,  # type: ignore[arg-type]
            seq,
            f"proxy.{UID}.{getattr(event, 'category', 'declared')}",
            T0 + timedelta(seconds=seq),
        )
        for seq, event in enumerate(log, 1)
    ]


def unpromotable(state: ProxyState, item: Recorded) -> bool:
    """A promotion of a replacement never created: the view takes the event's word for the new
    instance, the reconciler has nothing to hand over and ignores it (``test_rotation_fold``).
    Only a log the reconciler did not write holds one; from there on the rotations may differ."""
    r = state.replacement
    return (
        isinstance(item.event, ReplacementPromoted)
        and r is not None
        and r.rotation_id == item.event.rotation_id
        and not r.provider_id
    )


def facts(view: proxy.ProxyView, state: ProxyState, rotations: bool) -> list[str]:
    """The names of the facts both keep on which they disagree."""
    status = state.status
    pairs: dict[str, tuple[object, object]] = {
        "namespace": (view.namespace, state.namespace),
        "name": (view.name, state.name),
        "spec": (view.spec, state.spec),
        "generation": (view.generation, state.generation),
        "cloud_init": (view.cloud_init, state.cloud_init),
        "deleting": (view.deleting, state.deleting),
        "removed": (view.removed, state.removed),
        "phase": (
            (view.phase, view.reason, view.message),
            (status.phase, status.reason, status.message) if status else (Phase.PENDING, "", ""),
        ),
    }
    if rotations:
        pairs["rotation"] = (view.rotation, state.rotation)
        pairs["replacement"] = (
            # The view leaves a failed create to the reconciler, who knows whether it is final
            # (``Replacement.failure``); where the view says it cannot take over, so does the
            # reconciler (below).
            view.replacement and msgspec.structs.replace(view.replacement, failure=""),
            state.replacement and msgspec.structs.replace(state.replacement, failure=""),
        )
        if view.replacement is not None and view.replacement.failure:
            pairs["failure"] = (True, bool(state.replacement and state.replacement.failure))
    return [name for name, (a, b) in pairs.items() if a != b]


@settings(max_examples=3000, deadline=None)
@given(st.lists(history_events, max_size=14))
def test_both_folds_keep_the_same_facts_after_every_event(log: list[Event | Unreadable]) -> None:
    view: proxy.ProxyView | None = None
    state = ProxyState(uid=UID)
    rotations = True
    for item in recorded(log):
        rotations = rotations and not unpromotable(state, item)
        view, _ = apply_tolerantly(proxy.apply, view, item, "PROXY")
        state = fold(UID, [item], state)
        assert (view is not None) == state.declared, item
        if view is not None:
            assert facts(view, state, rotations) == [], (item, view, state)
