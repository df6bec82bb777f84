"""The watcher's pure rules: reading a Proxy object, resolving cloud-init, the re-list diff,
and declarations with Kubernetes generations (on the in-memory store)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

from commands.declaring import Declaration, apply
from events import subjects
from events.proxyresource import spec_hash
from events.schemas import (
    CloudInit,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxySpec,
    ProxySpecChanged,
    SecretRef,
)
from events.store import Recorded
from projections.proxy import ProxyView
from projections.proxy import apply as track
from services.runtime.eventlog.memory import InMemoryEventStore
from services.watcher.pure.objects import (
    CLOUD_INIT_LABEL,
    FINALIZER,
    Problem,
    finalizers_with,
    finalizers_without,
    parse_proxy,
    resolve_cloud_init,
)
from services.watcher.pure.tracked import vanished

UID = "0b5e8f5e-1111-4c4c-9999-000000000001"


def raw_proxy(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {
            "name": "de-1",
            "namespace": "crawl",
            "uid": UID,
            "generation": 3,
            "resourceVersion": "42",
            "finalizers": ["other/keep"],
        },
        "spec": {"provider": "local", **spec},
        "status": {"phase": "Ready"},
    }


def secret(data: dict[str, str], *, labelled: bool = True) -> dict[str, Any]:
    labels = {CLOUD_INIT_LABEL: "true"} if labelled else {}
    return {
        "metadata": {"name": "ci", "namespace": "crawl", "labels": labels},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def test_parse_reads_metadata_spec_and_status() -> None:
    obj = parse_proxy(raw_proxy(attributes={"country": "de"}))
    assert (obj.uid, obj.namespace, obj.name, obj.generation) == (UID, "crawl", "de-1", 3)
    assert obj.resource_version == "42"
    assert obj.spec is not None
    assert obj.spec.attributes == {"country": "de"}
    assert obj.status == {"phase": "Ready"}
    assert not obj.deleting
    assert not obj.has_finalizer
    assert finalizers_with(obj) == ["other/keep", FINALIZER]


def test_deleting_and_finalizer_release_keeps_other_finalizers() -> None:
    raw = raw_proxy()
    raw["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    raw["metadata"]["finalizers"] = ["other/keep", FINALIZER]
    obj = parse_proxy(raw)
    assert obj.deleting
    assert obj.has_finalizer
    assert finalizers_without(obj) == ["other/keep"]


def test_a_spec_that_does_not_convert_is_a_problem_naming_the_field() -> None:
    obj = parse_proxy(raw_proxy(healthCheck={"intervalSeconds": "often"}))
    assert obj.spec is None
    assert obj.invalid is not None
    assert obj.invalid.condition == "InvalidSpec"
    assert "healthCheck.intervalSeconds" in obj.invalid.message


def test_cloud_init_inline_none_and_labelled_secret() -> None:
    assert resolve_cloud_init(parse_proxy(raw_proxy()), None) == ""
    inline = parse_proxy(raw_proxy(cloudInit={"inline": "#cloud-config\n"}))
    assert resolve_cloud_init(inline, None) == "#cloud-config\n"
    ref = parse_proxy(raw_proxy(cloudInit={"secretRef": {"name": "ci"}}))
    assert ref.secret_name == "ci"
    assert resolve_cloud_init(ref, secret({"userdata": "#cloud-config\nA"})) == "#cloud-config\nA"
    custom = parse_proxy(raw_proxy(cloudInit={"secretRef": {"name": "ci", "key": "boot"}}))
    assert resolve_cloud_init(custom, secret({"boot": "B"})) == "B"


def test_cloud_init_problems_name_the_secret_and_the_fix() -> None:
    ref = parse_proxy(raw_proxy(cloudInit={"secretRef": {"name": "ci"}}))
    missing = resolve_cloud_init(ref, None)
    assert isinstance(missing, Problem)
    assert (missing.condition, missing.reason) == ("CloudInitError", "SecretNotFound")
    assert "crawl/ci" in missing.message
    unlabelled = resolve_cloud_init(ref, secret({"userdata": "x"}, labelled=False))
    assert isinstance(unlabelled, Problem)
    assert unlabelled.reason == "SecretNotLabelled"
    assert CLOUD_INIT_LABEL in unlabelled.message
    no_key = resolve_cloud_init(ref, secret({"other": "x"}))
    assert isinstance(no_key, Problem)
    assert no_key.reason == "SecretKeyMissing"
    assert "other" in no_key.message


def _recorded(seq: int, event: Any) -> Recorded:
    return Recorded(event, seq, f"proxy.{event.uid}.declared", datetime(2026, 1, 1, tzinfo=UTC))


def test_the_view_keeps_source_and_cloud_init_and_vanished_ignores_the_cli() -> None:
    views: dict[str, ProxyView] = {}
    spec = ProxySpec(provider="local")
    events: list[ProxyDeclared | ProxySpecChanged | ProxyDeletionRequested] = [
        ProxyDeclared(uid="k1", namespace="a", name="x", spec=spec, source="kubernetes"),
        ProxyDeclared(uid="k2", namespace="a", name="y", spec=spec, source="kubernetes"),
        ProxyDeclared(uid="k3", namespace="a", name="z", spec=spec, source="kubernetes"),
        ProxyDeclared(uid="c1", namespace="a", name="w", spec=spec, source="cli"),
        ProxySpecChanged(uid="k1", spec=spec, cloud_init_resolved="new"),
        ProxyDeletionRequested(uid="k3"),
    ]
    for seq, event in enumerate(events, start=1):
        views[event.uid] = track(views.get(event.uid), _recorded(seq, event))
    assert views["k1"].cloud_init == "new"
    assert views["k1"].source == "kubernetes"
    assert vanished(["k1"], views) == ["k2"]  # k3 is already deleting, c1 is the CLI's


async def test_kubernetes_declarations_use_the_object_generation_and_cloud_init() -> None:
    store = InMemoryEventStore()
    ref = ProxySpec(provider="local", cloud_init=CloudInit(secret_ref=SecretRef(name="ci")))
    first = Declaration(UID, "crawl", "de-1", ref, "kubernetes", generation=1, cloud_init="A")
    assert (await apply(store, first)).result == "created"
    assert (await apply(store, first)).result == "unchanged"
    # The Secret rotated: same object generation, new content → a change, with a new spec hash.
    rotated = Declaration(UID, "crawl", "de-1", ref, "kubernetes", generation=1, cloud_init="B")
    assert (await apply(store, rotated)).result == "changed"
    assert (await apply(store, rotated)).result == "unchanged"
    # Only metadata-level generation moved (e.g. edited while unwatched and back): recorded.
    bumped = Declaration(UID, "crawl", "de-1", ref, "kubernetes", generation=4, cloud_init="B")
    assert (await apply(store, bumped)).result == "changed"
    events = [r.event for r in (await store.read(subjects.proxy(UID))).events]
    assert isinstance(events[0], ProxyDeclared)
    assert events[0].source == "kubernetes"
    assert events[0].cloud_init_resolved == "A"
    assert isinstance(events[1], ProxySpecChanged)
    assert events[1].generation == 1
    assert spec_hash(ref, "A") != spec_hash(ref, "B")
    assert isinstance(events[2], ProxySpecChanged)
    assert events[2].generation == 4
    assert len(events) == 3
