"""What the watcher decides about ProxyPool objects and the mirrors of their members, as plain
values (docs/pools.md, "On Kubernetes").

Pure: the API layer hands raw dicts in. A ProxyPool is read with the CLI's own parser
(``events.poolresource``), so the cluster and ``apply -f`` refuse the same pools with the same
words; a pool the parser refuses is kept as a ``Problem`` shown in its status. A member's
*mirror* is a Proxy object named as the member, labelled ``pool=<name>``, owned by the ProxyPool
object (so Kubernetes' garbage collector deletes it with the pool) and annotated with the
member's uid in the log, which differs from the mirror's own uid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from events.customresource import API_VERSION, FieldError, ResourceError
from events.pool import PoolSpec
from events.poolresource import KIND, from_object, unknown_pool_fields
from events.proxyresource import KIND as PROXY_KIND
from events.schemas import ProxySpec
from projections.pool import PoolView
from projections.pool_members import MemberState, figures
from services.watcher.pure.crdschema import StatusCondition
from services.watcher.pure.objects import KubeObject, Problem, metadata
from services.watcher.pure.poolcrd import (
    INVALID_SPEC,
    MIRROR_ANNOTATION,
    POOL_LABEL,
    READY,
    SCALING,
    DecisionStatus,
    PoolStatus,
)
from services.watcher.pure.status import rfc3339

CONDITION_ORDER = (READY, SCALING, INVALID_SPEC)


@dataclass(frozen=True, slots=True)
class PoolObject(KubeObject):
    spec: PoolSpec | None = None
    problem: Problem | None = None


def parse_pool(raw: Mapping[str, Any]) -> PoolObject:
    """A ProxyPool as the API returned it; one the parser refuses keeps the reason."""
    fields = metadata(raw)
    namespace, name = fields["namespace"], fields["name"]
    spec: PoolSpec | None = None
    problem: Problem | None = None
    doc = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": raw.get("spec") if raw.get("spec") is not None else {},
    }
    errors = unknown_pool_fields(doc)
    try:
        if errors:
            raise ResourceError("proxypool", errors)
        _, spec = from_object(doc, source=f"ProxyPool {namespace}/{name}")
    except ResourceError as exc:
        problem = Problem(INVALID_SPEC, INVALID_SPEC, _message(exc.errors))
    return PoolObject(**fields, spec=spec, problem=problem)


def _message(errors: list[FieldError]) -> str:
    return "; ".join(str(e) for e in errors)[:1024] or "invalid ProxyPool"


def log_change(spec: PoolSpec, view: PoolView | None) -> str:
    """How the object's spec reaches the log: ``apply`` (declare, or the spec changed beyond
    its count) or ``scale`` (only ``replicas`` differs, as after ``kubectl scale``: appended as
    a scale, so members are not re-declared)."""
    if view is None or view.removed or view.deleting:
        return "apply"
    if msgspec.structs.replace(spec, replicas=view.spec.replicas) == view.spec:
        return "scale"
    return "apply"


# ------------------------------------------------------------------------------- status


def selector(pool_name: str) -> str:
    return f"{POOL_LABEL}={pool_name}"


def pool_status(
    obj: PoolObject,
    view: PoolView | None,
    states: Mapping[str, MemberState],
    free: int,
    *,
    observed: int,
    now: datetime,
) -> dict[str, Any]:
    """The whole ``.status`` the ProxyPool should show (``PoolStatus``'s shape). ``observed``:
    the object's generation last brought into the log; ``now``: when a condition that changes
    status is stamped (one that keeps its status keeps its time)."""
    conditions: dict[str, tuple[bool, str, str]] = {}
    last: DecisionStatus | None = None
    seen = None
    if view is not None and not view.removed:
        seen = figures(view, states)
        decision = view.last_decision
        if decision is not None and view.decided_at is not None:
            last = DecisionStatus(
                reason=decision.reason, message=decision.message, at=rfc3339(view.decided_at)
            )
    if obj.problem is not None:
        conditions[INVALID_SPEC] = (True, obj.problem.reason, obj.problem.message)
        conditions[READY] = (False, obj.problem.reason, obj.problem.message)
    if seen is None or view is None:
        if READY not in conditions:
            conditions[READY] = (False, "Waiting", "not declared to the event log yet")
    elif view.deleting or obj.deleting:
        conditions[READY] = (False, "Deleting", f"{seen.members} members left to retire")
    else:
        good = seen.healthy
        if good >= seen.desired and seen.members == seen.desired:
            conditions.setdefault(READY, (True, "MembersReady", f"{good} of {seen.desired}"))
        else:
            message = f"{good} of {seen.desired} members Ready and healthy"
            conditions.setdefault(READY, (False, "MembersNotReady", message))
        if seen.members < seen.desired:
            scaling = (True, "ScalingUp", f"{seen.members} of {seen.desired} members")
        elif seen.members > seen.desired:
            scaling = (True, "ScalingDown", f"{seen.members} members for {seen.desired}")
        elif seen.rotating:
            scaling = (True, "Rotating", f"{seen.rotating} members rotating")
        else:
            scaling = (False, "Stable", "")
        conditions[SCALING] = scaling
    status = PoolStatus(
        observed_generation=observed,
        desired=seen.desired if seen is not None else 0,
        replicas=seen.members if seen is not None else 0,
        ready=seen.ready if seen is not None else 0,
        healthy=seen.healthy if seen is not None else 0,
        leased=seen.leased if seen is not None else 0,
        available=free if seen is not None else 0,
        selector=selector(obj.name),
        conditions=_stamp(conditions, obj.status.get("conditions"), now, observed),
        last_decision=last,
    )
    encoded: dict[str, Any] = msgspec.to_builtins(status)
    return encoded


def _stamp(
    conditions: Mapping[str, tuple[bool, str, str]],
    previous: object,
    now: datetime,
    generation: int,
) -> list[StatusCondition]:
    before: dict[str, Mapping[str, Any]] = {}
    if isinstance(previous, list):
        before = {str(c.get("type")): c for c in previous if isinstance(c, Mapping)}
    out = []
    order = {t: i for i, t in enumerate(CONDITION_ORDER)}
    for type_, (status, reason, message) in sorted(
        conditions.items(), key=lambda kv: order.get(kv[0], 99)
    ):
        word = "True" if status else "False"
        old = before.get(type_)
        kept = old.get("lastTransitionTime") if old and old.get("status") == word else None
        out.append(
            StatusCondition(
                type=type_,
                status=word,
                reason=reason,
                message=message,
                last_transition_time=str(kept) if kept else rfc3339(now),
                observed_generation=generation,
            )
        )
    return out


OWNED = tuple(f.encode_name for f in msgspec.structs.fields(PoolStatus))


def status_patch(desired: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch from ``current`` to ``desired`` (fields now empty cleared); None when
    they are equal."""
    if all(current.get(k) == desired.get(k) for k in OWNED):
        return None
    return {**{k: None for k in OWNED if k in current and k not in desired}, **desired}


# ------------------------------------------------------------------------------- mirrors


def mirror_member(raw: Mapping[str, Any]) -> str:
    """The member uid a Proxy object mirrors, or ``""`` for a Proxy of its own."""
    meta = raw.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    value = annotations.get(MIRROR_ANNOTATION) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) else ""


def owned_by_pool(raw: Mapping[str, Any]) -> bool:
    meta = raw.get("metadata") or {}
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    if not isinstance(refs, list):
        return False
    return any(
        isinstance(r, Mapping) and r.get("kind") == KIND and r.get("apiVersion") == API_VERSION
        for r in refs
    )


def is_mirror(raw: Mapping[str, Any]) -> bool:
    """Marked as a mirror (the annotation) or owned by a ProxyPool: either is enough, so a hand
    edit that drops one does not turn a mirror into a Proxy of its own."""
    return bool(mirror_member(raw)) or owned_by_pool(raw)


def mirror(pool: PoolObject, member_name: str, member_uid: str, spec: ProxySpec) -> dict[str, Any]:
    """The Proxy object a member is shown as: what the watcher creates, and puts back."""
    return {
        "apiVersion": API_VERSION,
        "kind": PROXY_KIND,
        "metadata": {
            "name": member_name,
            "namespace": pool.namespace,
            "labels": {POOL_LABEL: pool.name},
            "annotations": {MIRROR_ANNOTATION: member_uid},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": pool.name,
                    "uid": pool.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": _compact(msgspec.to_builtins(spec)),
    }


def _compact(node: Any) -> Any:
    """Without empty objects (a default placement, health check): what ``kubectl get -o yaml``
    shows is what a person would write."""
    if not isinstance(node, dict):
        return node
    out = {k: _compact(v) for k, v in node.items()}
    return {k: v for k, v in out.items() if v != {}}


def mirror_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch that puts a mirror back: its spec exactly, and the pool's label,
    annotation and owner (other labels and annotations a person added are left). None: it
    shows what it should."""
    meta = current.get("metadata") or {}
    want = desired["metadata"]
    patch: dict[str, Any] = {}
    spec = merge_patch(current.get("spec") or {}, desired["spec"])
    if spec is not None:
        patch["spec"] = spec
    changed: dict[str, Any] = {}
    for key in ("labels", "annotations"):
        have = meta.get(key) or {}
        wrong = {k: v for k, v in want[key].items() if have.get(k) != v}
        if wrong:
            changed[key] = wrong
    if (meta.get("ownerReferences") or []) != want["ownerReferences"]:
        changed["ownerReferences"] = want["ownerReferences"]
    if changed:
        patch["metadata"] = changed
    return patch or None


def merge_patch(current: object, desired: object) -> Any:
    """RFC 7386: the merge patch that turns ``current`` into ``desired`` (keys ``current`` has
    and ``desired`` lacks are nulled); None when equal."""
    if current == desired:
        return None
    if not isinstance(current, Mapping) or not isinstance(desired, Mapping):
        return desired
    patch: dict[str, Any] = {k: None for k in current if k not in desired}
    for key, value in desired.items():
        if key not in current:
            patch[key] = value
            continue
        sub = merge_patch(current[key], value)
        if sub is not None or (value is None and current[key] is not None):
            patch[key] = sub
    return patch or None
