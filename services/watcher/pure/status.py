"""The status writer's decisions: proxy view → the custom resource's ``.status`` and Events.

Pure. ``.status`` is a projection of the log (plus the problems only the cluster can show: a
cloud-init Secret that is missing or not labelled, a spec that does not convert). Rebuilding it
from the log gives the same status, so a new leader writes nothing new; the transition times come
from the JetStream timestamp of the event that caused them, not from the writer's clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from events.schemas import Phase
from projections.proxy import ProxyView
from services.watcher.pure.crdschema import StatusCondition
from services.watcher.pure.objects import Problem
from services.watcher.pure.proxycrd import (
    CLOUD_INIT_ERROR,
    HEALTH_HEALTHY,
    HEALTH_UNHEALTHY,
    HEALTH_UNKNOWN,
    HEALTHY,
    PROVISIONED,
    READY,
    ProxyStatus,
)

INVALID_SPEC = "InvalidSpec"
CONDITION_ORDER = (READY, PROVISIONED, HEALTHY, CLOUD_INIT_ERROR, INVALID_SPEC)
COMPONENT = "egress-proxies-watcher"


@dataclass(frozen=True, slots=True)
class Notice:
    """A Kubernetes Event to record for a transition (``kubectl describe px`` shows them)."""

    type: str  # Normal | Warning
    reason: str
    message: str


def rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _cond(type_: str, status: bool, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason or ("Ok" if status else "Unknown"),
        "message": message,
    }


def health_word(view: ProxyView | None) -> str:
    healthy = view.healthy if view is not None else None
    if healthy is None:
        return HEALTH_UNKNOWN
    return HEALTH_HEALTHY if healthy else HEALTH_UNHEALTHY


def desired_status(
    view: ProxyView | None,
    problem: Problem | None,
    *,
    generation: int,
    previous: dict[str, Any],
    now: datetime,
) -> dict[str, Any]:
    """The whole ``.status`` the Proxy should show, as JSON (``ProxyStatus``'s shape).

    ``previous`` is the status the object has now: a condition whose status did not change keeps
    its ``lastTransitionTime``. ``now`` is when the latest fact happened (the JetStream time of
    the view's last event), used only for conditions that do change.
    """
    declared = view is not None and bool(view.name)
    conditions: dict[str, dict[str, Any]] = {}
    if declared:
        assert view is not None
        for c in view.conditions:
            conditions[c.type] = _cond(c.type, c.status == "True", c.reason, c.message)
        if view.healthy is not None:
            reason = "ProbeSucceeded" if view.healthy else "ProbeFailed"
            conditions[HEALTHY] = _cond(HEALTHY, view.healthy, reason)
        phase, reason, message = view.phase, view.reason, view.message
        if phase is Phase.FAILED and reason == INVALID_SPEC:
            # The reconciler refused the spec: the same condition a spec that does not even
            # convert gets here, so one condition type says "fix the spec".
            conditions[INVALID_SPEC] = _cond(INVALID_SPEC, True, reason, message)
    else:
        phase, reason, message = Phase.PENDING, "Waiting", "not declared to the event log yet"
    if view is not None and view.spec.cloud_init is not None and view.spec.cloud_init.secret_ref:
        conditions[CLOUD_INIT_ERROR] = _cond(CLOUD_INIT_ERROR, False, "SecretResolved")
    if problem is not None:
        conditions[problem.condition] = _cond(
            problem.condition, True, problem.reason, problem.message
        )
        if not declared:
            phase, reason, message = Phase.FAILED, problem.reason, problem.message
    blockers = [
        c
        for t, c in conditions.items()
        if t in (CLOUD_INIT_ERROR, INVALID_SPEC) and c["status"] == "True"
    ]
    unhealthy = conditions.get(HEALTHY, {}).get("status") == "False"
    if phase is Phase.READY and not blockers and not unhealthy:
        conditions[READY] = _cond(READY, True, reason or "InstanceRunning", message)
    elif blockers:
        conditions[READY] = _cond(READY, False, blockers[0]["reason"], blockers[0]["message"])
    elif unhealthy:
        conditions[READY] = _cond(READY, False, "Unhealthy", message)
    else:
        conditions[READY] = _cond(READY, False, reason or str(phase), message)
    if PROVISIONED not in conditions:
        conditions[PROVISIONED] = _cond(PROVISIONED, False, reason or str(phase))
    observed = generation
    if declared and view is not None:
        observed = view.observed_generation or view.generation
    status = ProxyStatus(
        phase=phase,
        reason=reason,
        message=message,
        ip=view.ip if view is not None else "",
        url=view.url if view is not None else "",
        provider_id=view.provider_id if view is not None else "",
        observed_generation=observed,
        health=health_word(view),
        latency_ms=round(view.latency_ms, 1) if view and view.latency_ms is not None else None,
        conditions=_stamp(conditions, previous.get("conditions") or [], now, observed),
    )
    encoded: dict[str, Any] = msgspec.to_builtins(status)
    return encoded


def _stamp(
    conditions: dict[str, dict[str, Any]],
    previous: list[dict[str, Any]],
    now: datetime,
    generation: int,
) -> list[StatusCondition]:
    before = {c.get("type"): c for c in previous if isinstance(c, dict)}
    order = {t: i for i, t in enumerate(CONDITION_ORDER)}
    out = []
    for type_, cond in sorted(conditions.items(), key=lambda kv: (order.get(kv[0], 99), kv[0])):
        old = before.get(type_)
        same = old is not None and old.get("status") == cond["status"]
        stamp = old.get("lastTransitionTime") if same and old is not None else None
        out.append(
            StatusCondition(
                type=type_,
                status=cond["status"],
                reason=cond["reason"],
                message=cond["message"],
                last_transition_time=stamp or rfc3339(now),
                observed_generation=generation,
            )
        )
    return out


OWNED = tuple(f.encode_name for f in msgspec.structs.fields(ProxyStatus))
"""Every ``.status`` field the writer owns (all of them)."""


def differs(desired: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether a patch is needed (a field left out of ``desired`` is empty, not unknown)."""
    return any(current.get(key) != desired.get(key) for key in OWNED)


def patch_body(desired: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """A merge patch from ``current`` to ``desired``: fields now empty are cleared (null), as a
    replacement's old IP must not survive in a status without one."""
    return {**{k: None for k in OWNED if k in current and k not in desired}, **desired}


def notices(before: dict[str, Any], after: dict[str, Any]) -> list[Notice]:
    """The transitions worth an Event: phase, address, health and problem conditions."""
    out: list[Notice] = []
    phase, old_phase = after.get("phase"), before.get("phase")
    if phase != old_phase:
        warning = phase == Phase.FAILED
        detail = f": {after.get('message')}" if after.get("message") else ""
        ip = f" at {after.get('ip')}" if phase == Phase.READY and after.get("ip") else ""
        out.append(
            Notice(
                "Warning" if warning else "Normal",
                after.get("reason") or str(phase),
                f"phase {old_phase or 'none'} -> {phase}{ip}{detail}",
            )
        )
    elif after.get("ip") != before.get("ip") and after.get("ip"):
        out.append(Notice("Normal", "AddressChanged", f"new IP {after.get('ip')}"))
    old_conditions = {c.get("type"): c for c in before.get("conditions") or []}
    for cond in after.get("conditions") or []:
        type_, status = cond["type"], cond["status"]
        reason, message = cond.get("reason", ""), cond.get("message", "")
        old = old_conditions.get(type_, {})
        if old.get("status") == status and old.get("reason", "") == reason:
            continue
        if type_ == HEALTHY and (old or status == "False"):
            kind = "Normal" if status == "True" else "Warning"
            out.append(Notice(kind, reason, f"health: {reason}"))
        elif type_ in (CLOUD_INIT_ERROR, INVALID_SPEC) and status == "True":
            out.append(Notice("Warning", reason, message))
    return out
