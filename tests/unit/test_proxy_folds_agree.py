"""One PROXY stream, two folds: the proxy view (``projections.proxy``), which the API, the
status writer and discovery read, and the reconciler's view (``services.reconciler.pure.view``),
which it decides on. Over any history the log can hold, hostile ones included, the facts both
keep agree (docs/decisions/0146-one-proxy-history-two-folds-held-together.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
from hypothesis import example, given, settings
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
from tests.support.rotation_stories import DRAIN, NEW_SPEC, SPEC, UID, Story, failed

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


@settings(max_examples=2000, deadline=None)
@given(st.lists(history_events, max_size=14))
def test_both_folds_keep_the_same_facts_after_every_event(log: list[Event | Unreadable]) -> None:
    """The log is trusted for nothing: a stray publish, a duplicate, an answer to no command,
    an event before the declaration or after the removal. Folded as each reader folds it (the
    view through ``apply_tolerantly``), what the API shows and what the reconciler decides on
    must not part."""
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


# ------------------------------------------------------- the histories the services write

Action = tuple[str, bool]


def act(story: Story, action: Action, rotations: list[int]) -> None:
    """One move of one writer: the reconciler decides, the executor answers the command that is
    out (well or not), the health service judges what it probes, a user or a lease holder asks."""
    kind, yes = action
    state = story.state
    view = proxy.fold(story.events)
    r = state.replacement

    def exists(provider_id: str) -> bool:
        return bool(provider_id) and (
            provider_id == state.instance_id or (r is not None and provider_id == r.provider_id)
        )

    match kind:
        case "decide":
            story.step()
        case "answer" if state.pending is not None:
            answer_well(story, story.command())
        case "time out" if state.pending is not None:
            story.add(failed(story.command(), ErrorClass.TRANSIENT, "timed out"))  # type: ignore[arg-type]
        case "refuse" if state.pending is not None:
            story.add(failed(story.command(), ErrorClass.PERMANENT))  # type: ignore[arg-type]
        case "judge" | "approve" if view is not None and exists(proxy.probe_target(view)[0]):
            story.healthy(proxy.probe_target(view)[0], healthy=yes or kind == "approve")
        case "late":
            # A probe still out when its instance went (deleted, replaced, or rotated out).
            made = [
                r.event.provider_id for r in story.events if isinstance(r.event, InstanceCreated)
            ]
            if made:
                story.healthy(made[len(made) // 2 if yes else 0], healthy=yes)
        case "rotate":
            rotations.append(len(rotations) + 1)
            story.add(RotationRequested(uid=UID, rotation_id=f"rot-{len(rotations)}"))
        case "change":
            generation = state.generation + 1
            spec = NEW_SPEC if yes else SPEC
            story.add(ProxySpecChanged(uid=UID, spec=spec, generation=generation))
        case "delete":
            story.add(ProxyDeletionRequested(uid=UID))
        case "lease":
            story.leased = yes
        case "wait":
            story.wait(DRAIN + 1 if yes else 1)
        case _:
            pass


def answer_well(story: Story, command: Event) -> None:
    match command:
        case CreateInstance():
            story.run(command, ip=f"10.0.0.{len(story.events) % 250 + 1}")
        case DeleteInstance():
            story.add(
                InstanceGone(
                    command_id=command.command_id,
                    provider="local",
                    provider_id=command.provider_id,
                )
            )
        case ObserveInstance():
            story.add(
                InstanceObserved(
                    command_id=command.command_id,
                    provider="local",
                    provider_id=command.provider_id,
                    state=InstanceState.RUNNING,
                    ip="10.0.0.1",
                )
            )
        case _:
            pass


actions = st.tuples(
    st.sampled_from(
        ["decide"] * 6
        + ["answer"] * 5
        + ["approve"] * 4
        + ["judge"] * 2
        + ["rotate", "lease", "wait"] * 2
        + ["time out", "refuse", "change", "delete", "late", "late"]
    ),
    st.booleans(),
)


READY: list[Action] = [("decide", False), ("answer", True), ("approve", True), ("decide", False)]
RACES: list[list[Action]] = [
    # A verdict landing after its instance was deleted; after the create that replaces it.
    [*READY, ("delete", False), ("decide", False), ("answer", True), ("late", False)],
    [
        *READY,
        *[("change", True), ("decide", False), ("answer", True), ("decide", False)],
        *[("late", False), ("answer", True), ("decide", False)],
    ],
]


@settings(max_examples=600, deadline=None)
@given(st.lists(actions, max_size=40))
@example(RACES[0])
@example(RACES[1])
def test_over_the_services_histories_they_agree_on_the_instance_and_its_health(
    moves: list[Action],
) -> None:
    """Where the services wrote the log, the instance the reconciler acts on is the one the view
    shows, and both count the same verdicts."""
    story = Story().add(ProxyDeclared(uid=UID, namespace="ns", name="p1", spec=SPEC))
    rotations: list[int] = []
    for move in moves:
        act(story, move, rotations)
    view: proxy.ProxyView | None = None
    state = ProxyState(uid=UID)
    for item in story.events:
        view = proxy.apply(view, item)
        state = fold(UID, [item], state)
        assert facts(view, state, rotations=True) == [], item
        if state.instance_id:
            assert view.provider_id == state.instance_id, item
        assert view.healthy == state.healthy, item
