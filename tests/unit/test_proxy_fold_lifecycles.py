"""The proxy view through whole lifecycles, as a table: each step is an event and the changes it
must make, and the whole view is compared after every step (a field that moves when it should
not fails as surely as one that does not move). That includes the facts services act on: the
declaration's source and cloud-init, the last instance fact and the last verdict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from events.schemas import (
    Condition,
    CreateInstance,
    DeleteInstance,
    Event,
    HealthChanged,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyRemoved,
    ProxySpec,
    ProxySpecChanged,
)
from events.store import Recorded, Unreadable
from projections.proxy import GONE, InstanceFact, ProxyView, apply

UID = "u1"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SPEC = ProxySpec(provider="local", attributes={"country": "de"})
SPEC2 = ProxySpec(provider="local", attributes={"country": "fr"})
READY_CONDITION = (Condition(type="Ready", status="True", reason="InstanceRunning"),)

Step = tuple[Event | Unreadable, dict[str, Any]]


def at(seq: int) -> datetime:
    return T0 + timedelta(seconds=seq)


def declared(spec: ProxySpec = SPEC, generation: int = 1) -> ProxyDeclared:
    return ProxyDeclared(uid=UID, namespace="ns", name="p1", spec=spec, generation=generation)


def ready(ip: str, port: int, pid: str) -> PhaseChanged:
    return PhaseChanged(
        phase=Phase.READY,
        reason="InstanceRunning",
        ip=ip,
        url=f"http://{ip}:{port}",
        provider_id=pid,
        observed_generation=1,
        conditions=READY_CONDITION,
    )


COMING = InstanceFact(provider_id="")
"""A create is out that has made no instance yet."""


def judged(verdict: HealthChanged, **changes: Any) -> Step:
    """A verdict is always kept as the last one, whichever instance it judged."""
    return (verdict, {**changes, "verdict": verdict})


def create(pid_hint: str) -> CreateInstance:
    return CreateInstance(
        command_id=f"c-{pid_hint}", provider="local", instance_name=pid_hint, spec=SPEC
    )


CREATE: list[Step] = [
    (
        declared(),
        {
            "namespace": "ns",
            "name": "p1",
            "spec": SPEC,
            "generation": 1,
            "source": "cli",
            "created_at": at(1),
        },
    ),
    (
        PhaseChanged(phase=Phase.PROVISIONING, reason="Creating"),
        {"phase": Phase.PROVISIONING, "reason": "Creating"},
    ),
    (create("i-1"), {"instance": COMING}),
    (
        InstanceCreated(command_id="c-i-1", provider="local", provider_id="i-1"),
        {"provider_id": "i-1", "instance": InstanceFact(provider_id="i-1")},
    ),
    (
        InstanceObserved(
            command_id="c-i-1",
            provider="local",
            provider_id="i-1",
            state=InstanceState.RUNNING,
            ip="127.0.0.1",
        ),
        {"instance": InstanceFact(provider_id="i-1", state="Running", ip="127.0.0.1")},
    ),
    (
        ready("127.0.0.1", 3128, "i-1"),
        {
            "phase": Phase.READY,
            "reason": "InstanceRunning",
            "ip": "127.0.0.1",
            "url": "http://127.0.0.1:3128",
            "conditions": READY_CONDITION,
            "observed_generation": 1,
        },
    ),
    judged(
        HealthChanged(healthy=True, latency_ms=12.5, provider_id="i-1"),
        healthy=True,
        latency_ms=12.5,
    ),
]

HEALTH: list[Step] = [
    judged(
        HealthChanged(healthy=False, reason="ProbeFailed", message="HTTP 502", provider_id="i-1"),
        healthy=False,
        latency_ms=None,
        health_message="HTTP 502",
    ),
    judged(HealthChanged(healthy=True, latency_ms=3.0, provider_id="old")),  # another instance
    judged(
        HealthChanged(healthy=True, latency_ms=4.0),
        healthy=True,
        latency_ms=4.0,
        health_message="",
    ),
    (Unreadable(type="HealthChanged", reason="undecodable"), {}),
    judged(
        HealthChanged(healthy=False, reason="ProbeFailed", message="timed out", provider_id="i-1"),
        healthy=False,
        latency_ms=None,
        health_message="timed out",
    ),
]

REPLACE: list[Step] = [
    (
        ProxySpecChanged(uid=UID, spec=SPEC2, generation=2, cloud_init_resolved="#cloud-config"),
        {"spec": SPEC2, "generation": 2, "cloud_init": "#cloud-config"},
    ),
    (
        PhaseChanged(
            phase=Phase.REPLACING, reason="SpecChanged", ip="127.0.0.1", url="http://127.0.0.1:3128"
        ),
        {"phase": Phase.REPLACING, "reason": "SpecChanged", "conditions": READY_CONDITION},
    ),
    (DeleteInstance(command_id="d-1", provider="local", provider_id="i-1"), {}),
    (
        InstanceGone(command_id="d-1", provider="local", provider_id="i-1"),
        {"instance": InstanceFact(provider_id="i-1", state=GONE)},
    ),
    # A probe still out when the instance went: its verdict is kept, it counts for nothing.
    judged(HealthChanged(healthy=False, message="refused", provider_id="i-1")),
    # The old verdict stays the last one (``verdict``), but no longer counts for the proxy.
    (
        create("i-2"),
        {"healthy": None, "latency_ms": None, "health_message": "", "instance": COMING},
    ),
    judged(HealthChanged(healthy=True, latency_ms=1.0, provider_id="i-1")),
    (
        InstanceCreated(command_id="c-i-2", provider="local", provider_id="i-2"),
        {"provider_id": "i-2", "instance": InstanceFact(provider_id="i-2")},
    ),
    (
        ready("127.0.0.1", 3129, "i-2"),
        {"phase": Phase.READY, "reason": "InstanceRunning", "url": "http://127.0.0.1:3129"},
    ),
    judged(
        HealthChanged(healthy=True, latency_ms=2.0, provider_id="i-2"),
        healthy=True,
        latency_ms=2.0,
    ),
]

DELETE: list[Step] = [
    (ProxyDeletionRequested(uid=UID), {"deleting": True}),
    (
        PhaseChanged(phase=Phase.DELETING, reason="Deleting"),
        {"phase": Phase.DELETING, "reason": "Deleting", "ip": "", "url": ""},
    ),
    (DeleteInstance(command_id="d-2", provider="local", provider_id="i-2"), {}),
    (
        InstanceGone(command_id="d-2", provider="local", provider_id="i-2"),
        {"instance": InstanceFact(provider_id="i-2", state=GONE)},
    ),
    (ProxyRemoved(uid=UID), {"removed": True}),
]


def redeclare_steps(seq: int) -> list[Step]:
    """Declared again after removal: the view is new, as if nothing had happened before."""
    fresh = {
        f: v
        for f, v in msgspec.structs.asdict(ProxyView(uid=UID)).items()
        if f not in ("uid", "last_seq", "updated_at")
    }
    return [
        (
            declared(SPEC, generation=1),
            {
                **fresh,
                "namespace": "ns",
                "name": "p1",
                "spec": SPEC,
                "generation": 1,
                "source": "cli",
                "created_at": at(seq),
            },
        ),
    ]


def play(
    steps: list[Step], view: ProxyView | None = None, expected: ProxyView | None = None
) -> tuple[ProxyView | None, ProxyView | None]:
    seq = view.last_seq if view is not None else 0
    for event, changes in steps:
        seq += 1
        view = apply(view, Recorded(event, seq, f"proxy.{UID}.x", at(seq)))  # type: ignore[arg-type]
        expected = msgspec.structs.replace(
            expected or ProxyView(uid=UID), **changes, last_seq=seq, updated_at=at(seq)
        )
        assert view == expected, f"after step {seq} ({type(event).__name__})"
    return view, expected


@pytest.mark.parametrize(
    "lifecycle",
    [
        ["create"],
        ["create", "health"],
        ["create", "replace"],
        ["create", "health", "replace"],
        ["create", "health", "delete"],
        ["create", "replace", "delete", "redeclare", "create"],
        ["create", "delete", "redeclare", "create", "health", "delete"],
    ],
    ids="-".join,
)
def test_lifecycle(lifecycle: list[str]) -> None:
    view: ProxyView | None = None
    expected: ProxyView | None = None
    for part in lifecycle:
        if part == "redeclare":
            assert view is not None
            assert view.removed
            steps = redeclare_steps(view.last_seq + 1)
        else:
            steps = {"create": CREATE, "health": HEALTH, "replace": REPLACE, "delete": DELETE}[part]
            if part == "create" and view is not None:
                steps = steps[1:]  # the declaration was the redeclare step
        view, expected = play(steps, view, expected)
    assert view is not None


def test_redeclared_after_removal_is_listed_again() -> None:
    """The bug a user hit by re-running the README: apply, delete, apply made the proxy
    invisible, because the view stayed removed."""
    view, _ = play([*CREATE, *DELETE])
    assert view is not None
    assert view.removed
    view, _ = play(redeclare_steps(view.last_seq + 1), view, view)
    assert view is not None
    assert not view.removed
    assert not view.deleting
    assert view.phase is Phase.PENDING
    assert view.healthy is None
