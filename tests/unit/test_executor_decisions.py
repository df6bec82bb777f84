"""The executor's pure decisions: delays, what the sweep records (which answers end a command is
the protocol's, tested in ``test_command_protocol``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import get_args

from events.schemas import (
    AnyEvent,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxySpec,
)
from events.store import Recorded
from projections.commands import Answer
from projections.proxy import GONE, ProxyView, apply
from services.executor.commands import ANSWERS
from services.executor.pure.answers import observed
from services.executor.pure.observation import known_state, observation, watched
from services.executor.pure.policy import CommandPolicy
from services.providers.base import Instance

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def rec(seq: int, event: AnyEvent, category: str = "instance") -> Recorded:
    return Recorded(event=event, seq=seq, subject=f"proxy.u1.{category}", timestamp=T0)


def instance(state: InstanceState = InstanceState.RUNNING, ip: str = "10.0.0.1") -> Instance:
    return Instance(
        provider_id="pid-1", name="n", state=state, owner_uid="u1", created_at=T0, ip=ip
    )


def test_poll_delay_grows_to_its_cap() -> None:
    policy = CommandPolicy(poll_initial=0.5, poll_max=5.0, poll_growth=2.0)
    assert [policy.poll_delay(a) for a in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 4.0, 5.0]
    assert policy.poll_delay(10_000) == 5.0


def test_backoff_doubles_to_its_cap() -> None:
    policy = CommandPolicy(backoff_base=1.0, backoff_max=60.0)
    assert [policy.backoff(a) for a in (1, 2, 3, 7, 8)] == [1.0, 2.0, 4.0, 60.0, 60.0]
    assert policy.backoff(10_000) == 60.0


def test_observed_carries_the_instance() -> None:
    event = observed("c1", "p", instance())
    assert (event.ip, event.url, event.state) == ("10.0.0.1", "http://10.0.0.1:3128", "Running")
    assert event.created_at == T0.isoformat()


def ready_view(*extra: AnyEvent) -> ProxyView:
    events: list[Recorded] = [
        rec(1, ProxyDeclared(uid="u1", namespace="n", name="a", spec=ProxySpec(provider="p"))),
        rec(2, InstanceCreated(command_id="c1", provider="p", provider_id="pid-1")),
        rec(3, observed("c1", "p", instance())),
        rec(4, PhaseChanged(phase=Phase.READY, provider_id="pid-1"), "status"),
    ]
    events += [rec(5 + i, e) for i, e in enumerate(extra)]
    view: ProxyView | None = None
    for recorded in events:
        view = apply(view, recorded)
    assert view is not None
    return view


def test_the_known_state_is_the_current_instances() -> None:
    view = ready_view()
    assert view.instance is not None
    assert (known_state(view), view.instance.ip, view.last_seq) == ("Running", "10.0.0.1", 4)
    assert watched(view)
    gone = ready_view(InstanceGone(command_id="o", provider="p", provider_id="pid-1"))
    assert known_state(gone) == GONE
    replaced = ready_view(InstanceCreated(command_id="c2", provider="p", provider_id="pid-2"))
    assert known_state(replaced) == ""
    assert replaced.provider_id == "pid-2"
    # A late fact about the replaced instance says nothing about the current one.
    late = ready_view(
        InstanceCreated(command_id="c2", provider="p", provider_id="pid-2"),
        InstanceGone(command_id="o", provider="p", provider_id="pid-1"),
    )
    assert known_state(late) == ""


def test_only_ready_instances_are_watched() -> None:
    deleting = ready_view()
    deleting = apply(deleting, rec(9, ProxyDeletionRequested(uid="u1"), "declared"))
    assert not watched(deleting)
    replacing = apply(ready_view(), rec(9, PhaseChanged(phase=Phase.REPLACING), "status"))
    assert not watched(replacing)


def test_unchanged_answers_record_nothing() -> None:
    view = ready_view()
    assert observation(view, instance()) is None
    stopped = ready_view(observed("o", "p", instance(InstanceState.STOPPED, "")))
    assert observation(stopped, instance(InstanceState.STOPPED, "")) is None
    gone = ready_view(InstanceGone(command_id="o", provider="p", provider_id="pid-1"))
    assert observation(gone, None) is None


def test_changes_are_recorded_with_an_observe_command_id() -> None:
    view = ready_view()
    gone = observation(view, None)
    assert gone == InstanceGone(command_id="observe-4", provider="p", provider_id="pid-1")
    stopped = observation(view, instance(InstanceState.STOPPED, ""))
    assert isinstance(stopped, InstanceObserved)
    assert stopped.state is InstanceState.STOPPED
    moved = observation(view, instance(ip="10.0.0.2"))
    assert isinstance(moved, InstanceObserved)
    assert moved.ip == "10.0.0.2"
    back = ready_view(observed("o", "p", instance(InstanceState.STOPPED, "")))
    assert isinstance(observation(back, instance()), InstanceObserved)


def test_an_ipv6_instance_url_is_bracketed() -> None:
    event = observed("c1", "p", instance(ip="2001:db8::7"))
    assert event.url == "http://[2001:db8::7]:3128"
    assert instance(ip="").url == ""


def test_every_answer_is_read_from_the_one_category_the_executor_reads() -> None:
    """The executor reads a command's answers from one literal subject; an answer type written
    elsewhere would never be seen, and a command would be carried out twice."""
    assert {cls.category for cls in get_args(Answer)} == {ANSWERS}
