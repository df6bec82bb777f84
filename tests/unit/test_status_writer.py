"""The status writer's pure decisions: view → ``.status``, when to patch, which Events."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from events.schemas import CloudInit, Condition, Phase, ProxySpec, SecretRef
from projections.proxy import ProxyView
from services.watcher.pure.objects import Problem
from services.watcher.pure.status import desired_status, differs, notices, patch_body

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
T1 = datetime(2026, 1, 1, 12, 5, tzinfo=UTC)


def ready_view(**kw: object) -> ProxyView:
    base = ProxyView(
        uid="u1",
        namespace="crawl",
        name="de-1",
        spec=ProxySpec(provider="local"),
        generation=2,
        phase=Phase.READY,
        reason="InstanceRunning",
        ip="10.0.0.5",
        url="http://10.0.0.5:3128",
        provider_id="local/px-u1",
        conditions=(
            Condition(type="Ready", status="True", reason="InstanceRunning"),
            Condition(type="Provisioned", status="True", reason="InstanceRunning"),
        ),
        observed_generation=2,
        updated_at=T0,
    )
    return msgspec.structs.replace(base, **kw)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["type"]: c for c in status["conditions"]}


def test_ready_view_gives_the_printer_column_fields_and_ready_conditions() -> None:
    status = desired_status(ready_view(), None, generation=2, previous={}, now=T0)
    assert status["phase"] == "Ready"
    assert status["ip"] == "10.0.0.5"
    assert status["url"] == "http://10.0.0.5:3128"
    assert status["providerID"] == "local/px-u1"
    assert status["observedGeneration"] == 2
    assert status["health"] == "Unknown"
    by_type = conditions(status)
    assert by_type["Ready"]["status"] == "True"
    assert by_type["Provisioned"]["status"] == "True"
    assert by_type["Ready"]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert [c["type"] for c in status["conditions"]] == ["Ready", "Provisioned"]


def test_unhealthy_makes_ready_false_and_keeps_unchanged_transition_times() -> None:
    first = desired_status(ready_view(), None, generation=2, previous={}, now=T0)
    sick = ready_view(healthy=False, latency_ms=12.34, updated_at=T1)
    status = desired_status(sick, None, generation=2, previous=first, now=T1)
    by_type = conditions(status)
    assert by_type["Healthy"]["status"] == "False"
    assert by_type["Ready"]["status"] == "False"
    assert by_type["Ready"]["reason"] == "Unhealthy"
    assert by_type["Ready"]["lastTransitionTime"] == "2026-01-01T12:05:00Z"
    assert by_type["Provisioned"]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert status["health"] == "Unhealthy"
    assert status["latencyMs"] == 12.3
    assert status["phase"] == "Ready"  # the instance still runs; the conditions say why not


def test_cloud_init_problem_before_any_declaration_is_failed_with_the_reason() -> None:
    problem = Problem("CloudInitError", "SecretNotLabelled", "Secret crawl/ci lacks the label")
    status = desired_status(None, problem, generation=1, previous={}, now=T0)
    assert status["phase"] == "Failed"
    assert status["reason"] == "SecretNotLabelled"
    by_type = conditions(status)
    assert by_type["CloudInitError"]["status"] == "True"
    assert by_type["CloudInitError"]["reason"] == "SecretNotLabelled"
    assert by_type["Ready"]["status"] == "False"
    assert by_type["Ready"]["reason"] == "SecretNotLabelled"
    assert status["observedGeneration"] == 1


def test_cloud_init_resolved_is_a_false_condition_and_a_problem_keeps_the_instance_phase() -> None:
    spec = ProxySpec(provider="local", cloud_init=CloudInit(secret_ref=SecretRef(name="ci")))
    ok = desired_status(ready_view(spec=spec), None, generation=2, previous={}, now=T0)
    assert conditions(ok)["CloudInitError"]["status"] == "False"
    assert conditions(ok)["Ready"]["status"] == "True"
    problem = Problem("CloudInitError", "SecretNotFound", "gone")
    broken = desired_status(ready_view(spec=spec), problem, generation=2, previous=ok, now=T1)
    assert broken["phase"] == "Ready"
    assert conditions(broken)["CloudInitError"]["status"] == "True"
    assert conditions(broken)["Ready"]["status"] == "False"


def test_patch_only_on_change_and_emptied_fields_are_cleared() -> None:
    status = desired_status(ready_view(), None, generation=2, previous={}, now=T0)
    assert differs(status, {})
    assert not differs(status, dict(status))
    replacing = desired_status(
        ready_view(phase=Phase.REPLACING, reason="SpecChanged", ip="", url=""),
        None,
        generation=3,
        previous=status,
        now=T1,
    )
    body = patch_body(replacing, status)
    assert body["ip"] is None
    assert body["url"] is None
    assert body["phase"] == "Replacing"
    again = desired_status(ready_view(updated_at=T1), None, generation=2, previous=status, now=T1)
    assert not differs(again, status)  # a newer event that changes nothing visible


def test_notices_for_phase_address_and_problem_transitions() -> None:
    provisioning = desired_status(
        ready_view(phase=Phase.PROVISIONING, reason="Creating", ip="", url="", conditions=()),
        None,
        generation=1,
        previous={},
        now=T0,
    )
    first = notices({}, provisioning)
    assert [(n.type, n.reason) for n in first] == [("Normal", "Creating")]
    ready = desired_status(ready_view(), None, generation=2, previous=provisioning, now=T1)
    [became_ready] = notices(provisioning, ready)
    assert became_ready.reason == "InstanceRunning"
    assert "10.0.0.5" in became_ready.message
    moved = desired_status(ready_view(ip="10.0.0.9"), None, generation=2, previous=ready, now=T1)
    assert [n.reason for n in notices(ready, moved)] == ["AddressChanged"]
    assert notices(ready, ready) == []
    problem = Problem("CloudInitError", "SecretNotFound", "Secret crawl/ci does not exist")
    failed = desired_status(None, problem, generation=1, previous={}, now=T0)
    reasons = {(n.type, n.reason) for n in notices({}, failed)}
    assert ("Warning", "SecretNotFound") in reasons
