"""Rotation stories over the reconciler's pure decide (D85): a proxy's events appended one by
one, each decision applied, with the clock each story passes in. Shared by the decider's
tests, its retry rule's and the one rotation fold's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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
    Phase,
    Placement,
    ProviderFailed,
    ProxyDeclared,
    ProxySpec,
    ReplacementStarted,
    RotationRequested,
)
from events.store import Recorded
from services.reconciler.pure.decide import decide
from services.reconciler.pure.decision import Decision
from services.reconciler.pure.view import ProxyState, fold

UID = "0b5e8f8e-1111-4222-8333-944455556666"
SPEC = ProxySpec(provider="local", attributes={"country": "de"})
NEW_SPEC = ProxySpec(provider="local", attributes={"country": "de"}, placement=Placement(zone="b"))
T0 = datetime(2026, 1, 1, tzinfo=UTC)
DRAIN = 10.0


class Story:
    """Events as the reconciler, the executor and the health service would append them, each
    stamped by the story's clock; ``decide`` sees that clock too."""

    def __init__(self) -> None:
        self.events: list[Recorded] = []
        self.now = T0
        self.leased = False

    def add(self, *events: Event) -> Story:
        for event in events:
            seq = len(self.events) + 1
            subject = f"proxy.{UID}.{event.category}"
            self.events.append(Recorded(event, seq, subject, self.now))  # type: ignore[arg-type]
        return self

    def wait(self, seconds: float) -> Story:
        self.now += timedelta(seconds=seconds)
        return self

    @property
    def state(self) -> ProxyState:
        return fold(UID, self.events)

    def decide(self) -> Decision:
        return decide(self.state, self.now, leased=self.leased, drain=DRAIN)

    def step(self) -> Decision:
        decision = self.decide()
        self.add(*decision.events)
        return decision

    def command(self) -> Event:
        for r in reversed(self.events):
            if isinstance(r.event, Event) and r.event.category == "cmd":
                return r.event
        raise AssertionError("no command yet")

    def run(self, cmd: CreateInstance | None = None, ip: str = "10.0.0.1") -> str:
        """The executor makes ``cmd`` (the last command by default) run; its provider id."""
        cmd = cmd or self.command()  # type: ignore[assignment]
        assert isinstance(cmd, CreateInstance)
        pid = f"id-{cmd.instance_name}"
        self.add(
            InstanceCreated(command_id=cmd.command_id, provider="local", provider_id=pid),
            InstanceObserved(
                command_id=cmd.command_id,
                provider="local",
                provider_id=pid,
                state=InstanceState.RUNNING,
                ip=ip,
                url=f"http://{ip}:3128",
            ),
        )
        return pid

    def gone(self) -> None:
        cmd = self.command()
        assert isinstance(cmd, DeleteInstance)
        self.add(
            InstanceGone(command_id=cmd.command_id, provider="local", provider_id=cmd.provider_id)
        )

    def healthy(self, pid: str, healthy: bool = True) -> None:
        self.add(HealthChanged(healthy=healthy, reason="Probe", message="m", provider_id=pid))


def ready() -> tuple[Story, str]:
    story = Story().add(ProxyDeclared(uid=UID, namespace="ns", name="p1", spec=SPEC))
    story.step()
    pid = story.run(ip="10.0.0.1")
    story.healthy(pid)
    story.step()
    assert story.state.status is not None
    assert story.state.status.phase is Phase.READY
    assert story.decide().events == ()
    return story, pid


def requested() -> tuple[Story, str, CreateInstance]:
    story, old = ready()
    story.add(RotationRequested(uid=UID, rotation_id="rot-1", lease_id="lease-1"))
    decision = story.step()
    assert decision.outcome == "rotate"
    started, create = decision.events
    assert isinstance(started, ReplacementStarted)
    assert started.lease_id == "lease-1"
    assert isinstance(create, CreateInstance)
    assert create.command_id == started.command_id
    return story, old, create


def promoted() -> tuple[Story, str, str]:
    story, old, create = requested()
    new = story.run(create, ip="10.0.0.2")
    story.healthy(new)
    assert story.step().outcome == "promote"
    return story, old, new


def of(decision: Decision, kind: type[Event]) -> list[Event]:
    return [e for e in decision.events if isinstance(e, kind)]


# ------------------------------------------------------------------------------------ stories


def failed(
    command: CreateInstance | DeleteInstance,
    error_class: ErrorClass = ErrorClass.PERMANENT,
    message: str = "no such image",
) -> ProviderFailed:
    """The provider's answer that ``command`` failed."""
    operation = "create" if isinstance(command, CreateInstance) else "delete"
    return ProviderFailed(
        command_id=command.command_id,
        provider="local",
        operation=operation,
        error_class=error_class,
        message=message,
    )
