"""The kubernetes provider's pure parts: error table, names, ids, states, the settings block."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from events.schemas import InstanceState, ProxySpec
from services.providers.base import (
    CREATED_AT_LABEL,
    MANAGED_LABEL,
    OWNER_LABEL,
    CreateRequest,
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from services.providers.config import build_providers, parse_providers_config
from services.providers.kubernetes.config import DEFAULT_IMAGE, KubernetesConfig
from services.providers.kubernetes.pure.classify import classify, error_for
from services.providers.kubernetes.pure.mapping import (
    build_pod,
    instance_of,
    label_value,
    parse_provider_id,
    pod_name,
    selector,
    state_of,
)
from services.runtime.settings.errors import ConfigError

QUOTA = 'pods "px-1" is forbidden: exceeded quota: compute, requested: pods=1, limited: pods=10'

CASES: list[tuple[int, str, str, str, type[ProviderError]]] = [
    (403, "Forbidden", QUOTA, "create", QuotaExceeded),
    (429, "TooManyRequests", "exceeded quota: gpu", "create", QuotaExceeded),
    (429, "TooManyRequests", "throttled", "create", Transient),
    (403, "Forbidden", 'User "x" cannot create resource "pods"', "create", Permanent),
    (401, "Unauthorized", "", "list", Permanent),
    (422, "Invalid", "spec.containers[0].image: Required value", "create", Permanent),
    (400, "BadRequest", "bad body", "create", Permanent),
    (404, "NotFound", 'pods "px-1" not found', "get", NotFound),
    (404, "NotFound", 'pods "px-1" not found', "delete", NotFound),
    (404, "NotFound", 'namespaces "nope" not found', "create", Permanent),
    (409, "Conflict", "the object has been modified", "delete", Transient),
    (410, "Expired", "too old resource version", "list", Transient),
    (500, "InternalError", "failed calling webhook", "create", Transient),
    (503, "ServiceUnavailable", "", "get", Transient),
    (504, "Timeout", "", "list", Transient),
    (0, "", "connection refused", "get", Transient),
]


@pytest.mark.parametrize(("status", "reason", "message", "op", "expected"), CASES)
def test_classification_table(
    status: int, reason: str, message: str, op: str, expected: type[ProviderError]
) -> None:
    assert classify(status, reason, message, op=op) is expected


def test_errors_say_what_failed_and_why() -> None:
    error = error_for(403, "Forbidden", QUOTA, op="create", what="k8s: create pod default/px-1")
    assert isinstance(error, QuotaExceeded)
    assert str(error) == f"k8s: create pod default/px-1: HTTP 403 Forbidden: {QUOTA}"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("px-0f3a9c-abcd1234", "px-0f3a9c-abcd1234"),
        ("PX_Upper.case", None),
        ("x" * 80, None),
        ("---", None),
    ],
)
def test_pod_names_are_dns_labels_and_stable(name: str, expected: str | None) -> None:
    result = pod_name(name)
    if expected is not None:
        assert result == expected
    assert len(result) <= 63
    assert result == pod_name(name)
    assert result[0].isalnum()
    assert result[-1].isalnum()
    assert set(result) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")


def test_different_names_never_share_a_pod() -> None:
    assert pod_name("A_b") != pod_name("a-b")
    assert pod_name("x" * 70 + "1") != pod_name("x" * 70 + "2")


def test_provider_ids() -> None:
    assert parse_provider_id("crawlers/px-1") == ("crawlers", "px-1")
    for bad in ("px-1", "never-created-0", "a/b/c", "/px", "Ns/px", ""):
        assert parse_provider_id(bad) is None, bad


def test_label_values_are_kept_or_hashed() -> None:
    assert (
        label_value("5d1c2f0e-8b7a-4b55-9f0e-2b8e8d3f3a10")
        == "5d1c2f0e-8b7a-4b55-9f0e-2b8e8d3f3a10"
    )
    hashed = label_value("ends-with-")
    assert hashed.startswith("h-")
    assert hashed == label_value("ends-with-")
    assert selector("k8s") == "crawl.example.com/managed=true,crawl.example.com/provider=k8s"


def _pod(phase: str | None = None, **status: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {"metadata": {"name": "p", "namespace": "n"}, "status": dict(status)}
    if phase:
        pod["status"]["phase"] = phase
    return pod


READY = [{"type": "Ready", "status": "True"}]
NOT_READY = [{"type": "Ready", "status": "False"}]


@pytest.mark.parametrize(
    ("pod", "state"),
    [
        (_pod(), InstanceState.PENDING),
        (_pod("Pending"), InstanceState.PENDING),
        (_pod("Running"), InstanceState.PENDING),
        (_pod("Running", podIP="10.244.0.5", conditions=NOT_READY), InstanceState.PENDING),
        (_pod("Running", podIP="10.244.0.5", conditions=READY), InstanceState.RUNNING),
        (_pod("Running", podIP="10.244.0.5"), InstanceState.RUNNING),
        (_pod("Succeeded"), InstanceState.STOPPED),
        (_pod("Failed", reason="Evicted"), InstanceState.STOPPED),
        (_pod("Unknown"), InstanceState.UNKNOWN),
    ],
)
def test_pod_states(pod: dict[str, Any], state: InstanceState) -> None:
    assert state_of(pod) is state


def test_a_pod_being_deleted_is_terminating_whatever_its_phase() -> None:
    pod = _pod("Running", podIP="10.244.0.5", conditions=READY)
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert state_of(pod) is InstanceState.TERMINATING


def test_the_manifest_round_trips_into_an_instance() -> None:
    request = CreateRequest(
        name="px-0f3a-abcd1234",
        owner_uid="uid-1",
        namespace="crawlers",
        proxy_name="squid-1",
        spec=ProxySpec(provider="k8s"),
        spec_hash="abcd1234",
    )
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    pod = build_pod(request, KubernetesConfig(), "k8s", now)
    assert pod["metadata"]["namespace"] == "crawlers"
    assert pod["spec"]["containers"][0]["image"] == DEFAULT_IMAGE
    pod["metadata"]["uid"] = "pod-uid"
    pod["status"] = {"phase": "Running", "podIP": "10.244.1.2", "conditions": READY}
    instance = instance_of(pod, 3128, datetime.now(UTC))
    assert instance.provider_id == "crawlers/px-0f3a-abcd1234"
    assert instance.name == request.name
    assert instance.owner_uid == "uid-1"
    assert instance.created_at == now
    assert instance.url == "http://10.244.1.2:3128"
    assert instance.instance_uid == "pod-uid"
    assert instance.labels[MANAGED_LABEL] == "true"
    assert instance.labels[OWNER_LABEL] == "uid-1"
    assert instance.labels[CREATED_AT_LABEL] == now.isoformat()


def _config(block: dict[str, Any]) -> None:
    raw = {"providers": [{"name": "k8s", "type": "kubernetes", "kubernetes": block}]}
    parse_providers_config(raw, source="p.yaml", base_dir=Path(), default_data_dir=Path())


def test_the_settings_block_defaults_and_parses() -> None:
    raw = {"providers": [{"name": "k8s", "type": "kubernetes", "kubernetes": {}}]}
    (entry,) = parse_providers_config(
        raw, source="p.yaml", base_dir=Path(), default_data_dir=Path()
    )
    assert entry.config == KubernetesConfig()
    assert KubernetesConfig().image == "ubuntu/squid:6.6-24.04_edge"


@pytest.mark.parametrize(
    ("block", "complaint"),
    [
        ({"image": "has space"}, "kubernetes: image 'has space' is not an image reference"),
        ({"port": 0}, "kubernetes.port"),
        ({"context": "prod"}, "context needs kubeconfig"),
        ({"allowedClients": ["everyone"]}, "allowedClients: 'everyone' is not a CIDR"),
        ({"allowedClients": []}, "allowedClients is empty"),
        ({"memoryLimit": "lots"}, "memoryLimit 'lots' is not a Kubernetes quantity"),
        ({"nodeSelector": {"bad key!": "x"}}, "nodeSelector"),
        ({"imagePullPolicy": "Always"}, "imagePullPolicy"),
    ],
)
def test_bad_settings_name_the_field(block: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ConfigError, match="providers\\[0\\] \\(k8s\\)") as caught:
        _config(block)
    assert complaint in str(caught.value)


def test_outside_a_cluster_the_provider_names_its_own_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    raw = {"providers": [{"name": "k8s", "type": "kubernetes", "kubernetes": {}}]}
    entries = parse_providers_config(raw, source="p.yaml", base_dir=Path(), default_data_dir=Path())
    with pytest.raises(
        ConfigError, match=r"providers\[0\] \(k8s\): kubernetes.kubeconfig is not set"
    ):
        build_providers(entries)
    missing = {"kubeconfig": str(tmp_path / "nope")}
    raw = {"providers": [{"name": "k8s", "type": "kubernetes", "kubernetes": missing}]}
    entries = parse_providers_config(raw, source="p.yaml", base_dir=Path(), default_data_dir=Path())
    with pytest.raises(ConfigError, match=r"kubernetes\.kubeconfig: .* is not a file"):
        build_providers(entries)
