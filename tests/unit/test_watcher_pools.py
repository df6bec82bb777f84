"""What the watcher decides about ProxyPool objects and the Proxies that mirror their members,
without servers: hostile objects become a condition and never an exception, a ``kubectl scale``
is told apart from a spec change, the status carries the controller's figures and keeps its
transition times, and a mirror edited by hand is put back by a patch that touches only what the
pool owns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.pool import PoolDecided, PoolDeclared, PoolMember, PoolSpec
from events.schemas import Event, ProxySpec
from events.store import Recorded
from projections.pool import PoolView, fold
from projections.pool_members import MemberState
from services.watcher.pure.poolcrd import MIRROR_ANNOTATION, PoolStatus
from services.watcher.pure.pools import (
    is_mirror,
    log_change,
    merge_patch,
    mirror,
    mirror_member,
    mirror_patch,
    parse_pool,
    pool_status,
    status_patch,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)
MEMBERS = tuple(PoolMember(ordinal=i, name=f"de-m{i}", uid=f"u{i}", provider="a") for i in range(3))


def raw(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {
            "name": "de",
            "namespace": "crawl",
            "uid": "k8s-uid",
            "generation": 4,
            "resourceVersion": "77",
        },
        "spec": {"replicas": 3, "template": {"provider": "a"}, **spec},
    }


def view(*more: Event, replicas: int = 3) -> PoolView:
    spec = PoolSpec(replicas=replicas, template=ProxySpec(provider="a"))
    events: list[Event] = [
        PoolDeclared(uid="p", namespace="crawl", name="de", spec=spec, source="kubernetes"),
        PoolDecided(uid="p", reason="ScaleUp", message="added 3", added=MEMBERS),
        *more,
    ]
    recorded = [Recorded(e, i + 1, f"pool.p.{e.category}", AT) for i, e in enumerate(events)]  # type: ignore[arg-type]
    folded = fold(recorded)
    assert folded is not None
    return folded


def states(ready: int, healthy: int, leased: int = 0) -> dict[str, MemberState]:
    out = {}
    for i, m in enumerate(MEMBERS):
        out[m.uid] = MemberState(
            uid=m.uid, declared=True, ready=i < ready, healthy=i < healthy, leased=i < leased
        )
    return out


# ----------------------------------------------------------------------------- objects


def test_a_valid_pool_is_read_with_the_clis_parser() -> None:
    obj = parse_pool(raw(maxAge="6h"))
    assert obj.problem is None
    assert obj.spec is not None
    assert obj.spec.max_age_seconds == 6 * 3600
    assert (obj.uid, obj.namespace, obj.name, obj.generation) == ("k8s-uid", "crawl", "de", 4)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"maxAge": "6x"}, "spec.maxAge"),
        ({"replicas": 10_001}, "spec.replicas"),
        ({"replica": 3}, "spec.replica"),
        ({"template": {}}, "spec.template.provider"),
        ({"template": {"provider": "a", "attributes": {"pool": "x"}}}, "attributes.pool"),
        ({"spread": [{"provider": "a", "wieght": 2}]}, "spread[0]"),
        ({"replicas": "many"}, "replicas"),
    ],
)
def test_a_pool_the_parser_refuses_is_a_problem_naming_the_field(
    spec: dict[str, Any], field: str
) -> None:
    obj = parse_pool(raw(**spec))
    assert obj.spec is None
    assert obj.problem is not None
    assert obj.problem.condition == "InvalidSpec"
    assert field in obj.problem.message


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["metadata", "spec", "status", "kind"]),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=12), inner, max_size=4)
            ),
            max_leaves=12,
        ),
    )
)
def test_any_object_is_a_pool_or_a_problem_never_an_exception(obj: dict[str, Any]) -> None:
    parsed = parse_pool(obj)
    assert (parsed.spec is None) != (parsed.problem is None)
    is_mirror(obj)
    mirror_member(obj)


# ----------------------------------------------------------------------------- log changes


def test_only_a_count_change_is_a_scale() -> None:
    folded = view(replicas=3)
    spec = parse_pool(raw(replicas=7)).spec
    assert spec is not None
    assert log_change(spec, folded) == "scale"
    changed = parse_pool(raw(replicas=7, maxSurge=2)).spec
    assert changed is not None
    assert log_change(changed, folded) == "apply"
    assert log_change(spec, None) == "apply"


# ----------------------------------------------------------------------------- status


def test_the_status_carries_the_figures_the_selector_and_the_last_decision() -> None:
    obj = parse_pool(raw())
    status = pool_status(obj, view(), states(2, 1, leased=1), 1, observed=4, now=AT)
    msgspec.convert(status, PoolStatus)
    assert {k: status[k] for k in ("desired", "replicas", "ready", "healthy", "leased")} == {
        "desired": 3,
        "replicas": 3,
        "ready": 2,
        "healthy": 1,
        "leased": 1,
    }
    assert (status["available"], status["selector"], status["observedGeneration"]) == (
        1,
        "pool=de",
        4,
    )
    assert status["lastDecision"] == {
        "reason": "ScaleUp",
        "message": "added 3",
        "at": "2026-01-01T00:00:00Z",
    }
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (ready["status"], ready["message"]) == ("False", "1 of 3 members Ready and healthy")


def test_a_condition_keeps_its_time_until_its_status_changes() -> None:
    obj = parse_pool(raw())
    first = pool_status(obj, view(), states(0, 0), 0, observed=4, now=AT)
    later = AT + timedelta(minutes=5)
    again = pool_status(_with_status(obj, first), view(), states(1, 1), 1, observed=4, now=later)
    assert _times(again)["Ready"] == "2026-01-01T00:00:00Z"
    done = pool_status(_with_status(obj, again), view(), states(3, 3), 3, observed=4, now=later)
    assert _conditions(done)["Ready"] == "True"
    assert _times(done)["Ready"] == "2026-01-01T00:05:00Z"
    assert status_patch(done, done) is None
    patch = status_patch(done, first)
    assert patch is not None
    assert patch["ready"] == 3


def test_an_invalid_or_undeclared_pool_says_why() -> None:
    bad = parse_pool(raw(maxAge="6x"))
    status = pool_status(bad, None, {}, 0, observed=0, now=AT)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["InvalidSpec"]["status"] == "True"
    assert "spec.maxAge" in conditions["Ready"]["message"]
    waiting = pool_status(parse_pool(raw()), None, {}, 0, observed=0, now=AT)
    assert {c["type"]: c["reason"] for c in waiting["conditions"]} == {"Ready": "Waiting"}
    assert waiting["replicas"] == 0


def test_scaling_says_which_way() -> None:
    obj = parse_pool(raw())
    assert _reason(pool_status(obj, view(replicas=5), states(3, 3), 3, observed=1, now=AT)) == (
        "ScalingUp"
    )
    assert _reason(pool_status(obj, view(replicas=1), states(3, 3), 3, observed=1, now=AT)) == (
        "ScalingDown"
    )
    assert _reason(pool_status(obj, view(), states(3, 3), 3, observed=1, now=AT)) == "Stable"


def _with_status(obj: Any, status: dict[str, Any]) -> Any:
    import dataclasses  # noqa: PLC0415 - a helper of two tests

    return dataclasses.replace(obj, status=status)


def _times(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["lastTransitionTime"] for c in status["conditions"]}


def _conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


def _reason(status: dict[str, Any]) -> str:
    return str({c["type"]: c["reason"] for c in status["conditions"]}["Scaling"])


# ----------------------------------------------------------------------------- mirrors


def _mirror() -> dict[str, Any]:
    obj = parse_pool(raw())
    spec = ProxySpec(provider="a", attributes={"pool": "de"})
    return mirror(obj, "de-m0", "u0", spec)


def test_a_mirror_is_owned_by_its_pool_labelled_and_names_its_member() -> None:
    body = _mirror()
    meta = body["metadata"]
    assert meta["labels"] == {"pool": "de"}
    assert meta["annotations"] == {MIRROR_ANNOTATION: "u0"}
    (ref,) = meta["ownerReferences"]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("ProxyPool", "k8s-uid", True)
    assert body["spec"] == {"provider": "a", "attributes": {"pool": "de"}}
    assert is_mirror(body)
    assert mirror_member(body) == "u0"
    assert mirror_patch(body, body) is None


def test_either_mark_makes_a_mirror_and_a_plain_proxy_is_none() -> None:
    body = _mirror()
    no_annotation = {**body, "metadata": {**body["metadata"], "annotations": {}}}
    no_owner = {**body, "metadata": {**body["metadata"], "ownerReferences": []}}
    assert is_mirror(no_annotation)
    assert is_mirror(no_owner)
    assert not is_mirror({"metadata": {"name": "x", "ownerReferences": [{"kind": "ReplicaSet"}]}})


def test_a_hand_edit_is_put_back_and_a_persons_own_labels_are_left() -> None:
    desired = _mirror()
    edited = {
        **desired,
        "metadata": {
            **desired["metadata"],
            "labels": {"pool": "other", "team": "crawl"},
            "annotations": {},
            "ownerReferences": [],
        },
        "spec": {"provider": "b", "attributes": {"pool": "de", "country": "xx"}},
    }
    patch = mirror_patch(edited, desired)
    assert patch == {
        "spec": {"provider": "a", "attributes": {"country": None}},
        "metadata": {
            "labels": {"pool": "de"},
            "annotations": {MIRROR_ANNOTATION: "u0"},
            "ownerReferences": desired["metadata"]["ownerReferences"],
        },
    }


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=4),
        lambda inner: st.dictionaries(st.text(max_size=3), inner, max_size=4),
        max_leaves=10,
    ),
    st.recursive(
        st.integers() | st.text(max_size=4),
        lambda inner: st.dictionaries(st.text(max_size=3), inner, max_size=4),
        max_leaves=10,
    ),
)
def test_a_merge_patch_turns_one_document_into_the_other(current: Any, desired: Any) -> None:
    patch = merge_patch(current, desired)
    if patch is None:
        assert current == desired
    else:
        assert _apply(current, patch) == desired


def _apply(target: Any, patch: Any) -> Any:
    """RFC 7386's apply, to check ``merge_patch`` against."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _apply(out.get(key), value)
    return out
