"""The folds' side of a rotation (D85): the lease switch and its fencing token, and what the
shared proxy view shows and has probed while a replacement comes up."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from events.schemas import (
    CreateInstance,
    Event,
    External,
    HealthChanged,
    InstanceCreated,
    InstanceObserved,
    InstanceState,
    LeaseAcquired,
    LeaseReleased,
    LeaseSwitched,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyMode,
    ProxySpec,
    ReplacementPromoted,
    ReplacementStarted,
    RotationEnded,
    RotationRequested,
)
from events.store import Recorded
from projections import lease, proxy
from projections.proxy import probe_target, target_verdict
from services.discovery.leasing.rotation import NotRotatable, checked_proxy

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def recorded(event: Event, seq: int, subject: str, seconds: float = 0.0) -> Recorded:
    return Recorded(event, seq, subject, T0 + timedelta(seconds=seconds))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- lease fold


def leased(seq: int = 5) -> lease.LeaseView:
    claim = LeaseAcquired(lease_id="l1", proxy_uid="p1", ttl_seconds=60)
    return lease.apply(None, recorded(claim, seq, "lease.p1"))


def switch(
    rotation: str = "rot-1", lease_id: str = "l1", provider_id: str = "new"
) -> LeaseSwitched:
    return LeaseSwitched(
        lease_id=lease_id, proxy_uid="p1", rotation_id=rotation, provider_id=provider_id
    )


def test_a_switch_gives_the_lease_its_sequence_as_a_new_higher_token() -> None:
    view = leased()
    assert view.fencing_token == 5
    after = lease.apply(view, recorded(switch(), 9, "lease.p1", 1))
    assert after.current is not None
    assert (after.fencing_token, after.current.fencing_token) == (9, 9)
    assert (after.current.rotation_id, after.current.provider_id) == ("rot-1", "new")
    assert after.current.lease_id == "l1"
    assert after.current.expires_at == view.expires_at


def test_the_same_switch_twice_gives_one_token() -> None:
    once = lease.apply(leased(), recorded(switch(), 9, "lease.p1", 1))
    twice = lease.apply(once, recorded(switch(), 10, "lease.p1", 2))
    assert twice.fencing_token == 9


def test_a_switch_of_a_lease_that_is_not_current_changes_nothing() -> None:
    view = leased()
    other = lease.apply(view, recorded(switch(lease_id="l0"), 9, "lease.p1", 1))
    assert other.fencing_token == 5
    assert other.current == view.current
    released = lease.apply(
        view, recorded(LeaseReleased(lease_id="l1", proxy_uid="p1"), 6, "lease.p1", 1)
    )
    after = lease.apply(released, recorded(switch(), 9, "lease.p1", 2))
    assert after.current is None
    assert after.fencing_token == 5
    late = lease.apply(view, recorded(switch(), 9, "lease.p1", 61))
    assert late.current is None
    assert late.fencing_token == 5


def test_a_switch_it_cannot_use_is_counted_and_ignored() -> None:
    view = leased()
    after = lease.apply(view, recorded(switch(provider_id=""), 9, "lease.p1", 1))
    assert after.unusable == 1
    assert after.fencing_token == 5


def test_the_next_grant_after_a_switch_gets_a_higher_token_still() -> None:
    view = lease.apply(leased(), recorded(switch(), 9, "lease.p1", 1))
    view = lease.apply(
        view, recorded(LeaseReleased(lease_id="l1", proxy_uid="p1"), 10, "lease.p1", 2)
    )
    claim = LeaseAcquired(lease_id="l2", proxy_uid="p1", ttl_seconds=60)
    after = lease.apply(view, recorded(claim, 11, "lease.p1", 3))
    assert after.current is not None
    assert after.current.fencing_token == 11


# ------------------------------------------------------------------------------- proxy view

UID = "p1"


class Log:
    def __init__(self) -> None:
        self.view: proxy.ProxyView | None = None
        self.seq = 0

    def add(self, *events: Event) -> proxy.ProxyView:
        for event in events:
            self.seq += 1
            self.view = proxy.apply(
                self.view, recorded(event, self.seq, f"proxy.{UID}.{event.category}", self.seq)
            )
        assert self.view is not None
        return self.view


def observed(cid: str, pid: str, ip: str) -> InstanceObserved:
    return InstanceObserved(
        command_id=cid,
        provider="local",
        provider_id=pid,
        state=InstanceState.RUNNING,
        ip=ip,
        url=f"http://{ip}:3128",
    )


def serving() -> Log:
    log = Log()
    spec = ProxySpec(provider="local")
    log.add(
        ProxyDeclared(uid=UID, namespace="ns", name="n", spec=spec),
        CreateInstance(command_id="c1", provider="local", instance_name="px-1", spec=spec),
        InstanceCreated(command_id="c1", provider="local", provider_id="old"),
        observed("c1", "old", "10.0.0.1"),
        HealthChanged(healthy=True, latency_ms=5.0, provider_id="old"),
        PhaseChanged(
            phase=Phase.READY, ip="10.0.0.1", url="http://10.0.0.1:3128", provider_id="old"
        ),
    )
    return log


def test_the_view_keeps_showing_and_probing_the_serving_instance_until_the_replacement_runs() -> (
    None
):
    log = serving()
    view = log.add(RotationRequested(uid=UID, rotation_id="rot-1", lease_id="l1"))
    assert view.rotation is not None
    assert view.rotation.state == "requested"
    spec = ProxySpec(provider="local")
    view = log.add(
        ReplacementStarted(rotation_id="rot-1", command_id="c2", lease_id="l1"),
        CreateInstance(command_id="c2", provider="local", instance_name="px-2", spec=spec),
        InstanceCreated(command_id="c2", provider="local", provider_id="new"),
    )
    assert view.rotation is not None
    assert view.rotation.state == "creating"
    assert (view.provider_id, view.url, view.healthy) == ("old", "http://10.0.0.1:3128", True)
    assert probe_target(view) == ("old", "http://10.0.0.1:3128")
    view = log.add(observed("c2", "new", "10.0.0.2"))
    assert view.rotation is not None
    assert view.rotation.state == "probing"
    assert (view.provider_id, view.url) == ("old", "http://10.0.0.1:3128")
    assert probe_target(view) == ("new", "http://10.0.0.2:3128")
    assert target_verdict(view) is None  # the replacement is judged from scratch
    view = log.add(HealthChanged(healthy=True, latency_ms=7.0, provider_id="new"))
    assert view.healthy is True
    assert view.latency_ms == 5.0
    verdict = target_verdict(view)
    assert verdict is not None
    assert verdict.provider_id == "new"


def test_a_promotion_moves_the_address_the_instance_and_its_verdict() -> None:
    log = serving()
    spec = ProxySpec(provider="local")
    log.add(
        RotationRequested(uid=UID, rotation_id="rot-1"),
        ReplacementStarted(rotation_id="rot-1", command_id="c2"),
        CreateInstance(command_id="c2", provider="local", instance_name="px-2", spec=spec),
        InstanceCreated(command_id="c2", provider="local", provider_id="new"),
        observed("c2", "new", "10.0.0.2"),
        HealthChanged(healthy=True, latency_ms=7.0, provider_id="new"),
    )
    view = log.add(
        ReplacementPromoted(
            rotation_id="rot-1",
            provider_id="new",
            retired_provider_id="old",
            ip="10.0.0.2",
            url="http://10.0.0.2:3128",
        )
    )
    assert (view.provider_id, view.ip, view.url) == ("new", "10.0.0.2", "http://10.0.0.2:3128")
    assert (view.healthy, view.latency_ms, view.replacement) == (True, 7.0, None)
    assert view.rotation is not None
    assert view.rotation.state == "completed"
    assert probe_target(view) == ("new", "http://10.0.0.2:3128")
    verdict = target_verdict(view)
    assert verdict is not None
    assert verdict.provider_id == "new"


def test_an_ended_rotation_leaves_the_serving_instance_as_it_was() -> None:
    log = serving()
    before = log.view
    spec = ProxySpec(provider="local")
    log.add(
        RotationRequested(uid=UID, rotation_id="rot-1"),
        ReplacementStarted(rotation_id="rot-1", command_id="c2"),
        CreateInstance(command_id="c2", provider="local", instance_name="px-2", spec=spec),
        InstanceCreated(command_id="c2", provider="local", provider_id="new"),
        observed("c2", "new", "10.0.0.2"),
        HealthChanged(healthy=False, provider_id="new"),
    )
    view = log.add(RotationEnded(rotation_id="rot-1", outcome="failed", message="probes failed"))
    assert before is not None
    assert (view.provider_id, view.url, view.healthy) == (before.provider_id, before.url, True)
    assert view.rotation is not None
    assert (view.rotation.state, view.rotation.message) == (
        "failed",
        "probes failed",
    )
    assert probe_target(view) == ("old", "http://10.0.0.1:3128")


def test_events_of_an_unknown_rotation_change_nothing_but_the_sequence() -> None:
    log = serving()
    before = log.view
    view = log.add(
        ReplacementPromoted(rotation_id="nope", provider_id="x"),
        RotationEnded(rotation_id="nope"),
    )
    assert before is not None
    assert (view.provider_id, view.url, view.rotation) == (before.provider_id, before.url, None)
    assert view.last_seq == before.last_seq + 2


# ------------------------------------------------------------------------------- the API's check


def test_a_proxy_being_deleted_or_external_is_not_rotatable() -> None:
    log = serving()
    assert log.view is not None
    assert checked_proxy(log.view, "l1") is log.view
    deleting = log.add(ProxyDeletionRequested(uid=UID))
    with pytest.raises(NotRotatable, match="being deleted"):
        checked_proxy(deleting, "l1")
    external = ProxySpec(mode=ProxyMode.EXTERNAL, external=External(url="http://gw:3128"))
    with pytest.raises(NotRotatable, match="External"):
        checked_proxy(proxy.ProxyView(uid=UID, spec=external), "l1")
    with pytest.raises(NotRotatable):
        checked_proxy(None, "l1")
