"""services.runtime.kube.client's pure parts: where the cluster is, span names, error classes."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from multidict import CIMultiDict, CIMultiDictProxy

from services.runtime.kube.client import (
    MAX_RETRY_AFTER,
    KubeConfigError,
    KubeConflict,
    KubeForbidden,
    KubeGone,
    KubeInvalid,
    KubeNotFound,
    KubeSettings,
    KubeUnavailable,
    classify_api_error,
    kubeconfig_path,
    pause_after,
    resource_of,
    retry_after,
    settings_from_flags,
)


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/api/v1/namespaces/default/pods", "pods"),
        ("/api/v1/namespaces/default/pods/px-1", "pods"),
        ("/api/v1/pods", "pods"),
        ("/apis/crawl.example.com/v1alpha1/namespaces/ns/proxies/a/status", "proxies/status"),
        ("/apis/coordination.k8s.io/v1/namespaces/ns/leases/watcher", "leases"),
        ("/apis/crawl.example.com/v1alpha1/proxies", "proxies"),
        ("/api/v1/namespaces/ns", "namespaces"),
    ],
)
def test_span_names_have_no_object_names(path: str, resource: str) -> None:
    assert resource_of(path) == resource


def _exc(status: int, body: str = "") -> ApiException:
    exc = ApiException(status=status, reason="Reason")
    exc.body = body.encode()
    return exc


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (404, KubeNotFound),
        (409, KubeConflict),
        (410, KubeGone),
        (403, KubeForbidden),
        (422, KubeInvalid),
        (429, KubeUnavailable),
        (500, KubeUnavailable),
        (503, KubeUnavailable),
    ],
)
def test_api_errors_by_status(status: int, cls: type[Exception]) -> None:
    error = classify_api_error(_exc(status), "patch proxy ns/a")
    assert type(error) is cls
    assert str(error).startswith(f"patch proxy ns/a: HTTP {status}")


def test_the_status_message_is_used() -> None:
    body = '{"kind": "Status", "reason": "Expired", "message": "too old resource version: 5"}'
    error = classify_api_error(_exc(410, body))
    assert error.reason == "Expired"
    assert "too old resource version: 5" in str(error)


def test_explicit_kubeconfig_must_exist(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=r"--kubeconfig / KUBECONFIG: .* is not a file"):
        kubeconfig_path(KubeSettings(kubeconfig=str(tmp_path / "missing")), env={})
    real = tmp_path / "config"
    real.write_text("apiVersion: v1\n")
    assert kubeconfig_path(KubeSettings(kubeconfig=str(real)), env={}) == str(real)


def test_in_a_pod_the_service_account_is_used() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert kubeconfig_path(KubeSettings(), env=env) is None
    with pytest.raises(KubeConfigError, match="--kube-context"):
        kubeconfig_path(KubeSettings(context="prod"), env=env)


def test_outside_a_pod_without_a_kubeconfig_says_what_to_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeConfigError, match="set --kubeconfig / KUBECONFIG to a kubeconfig PATH"):
        kubeconfig_path(KubeSettings(), env={})


def test_flags_take_the_first_kubeconfig_of_a_list() -> None:
    assert settings_from_flags("/a/config:/b/config", " ctx ") == KubeSettings("/a/config", "ctx")
    assert settings_from_flags(None, None) == KubeSettings()


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("3", 3.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("61", MAX_RETRY_AFTER),
        ("999999999999999999999999", MAX_RETRY_AFTER),
        ("-5", 0.0),
        ("1.5", 0.0),
        ("1e9", 0.0),
        ("nan", 0.0),
        ("inf", 0.0),
        ("", 0.0),
        ("Wed, 21 Oct 2026 07:28:00 GMT", 0.0),
        ("\u0663", 0.0),  # a digit, but not an ASCII one
    ],
)
def test_retry_after_is_whole_seconds_within_bounds(header: str, seconds: float) -> None:
    assert retry_after({"Retry-After": header}) == seconds


def test_a_throttled_call_carries_the_pause_it_was_asked_for() -> None:
    exc = _exc(429, '{"reason": "TooManyRequests", "message": "too many requests"}')
    exc.headers = CIMultiDictProxy(CIMultiDict({"retry-after": "4"}))  # as aiohttp gives them
    error = classify_api_error(exc, "patch status of Proxy ns/a")
    assert isinstance(error, KubeUnavailable)
    assert error.retry_after == 4.0
    assert pause_after(error, 1.0) == 4.0
    assert pause_after(error, 10.0) == 10.0  # never shorter than our own delay
    assert classify_api_error(_exc(503)).retry_after == 0.0
    assert pause_after(ValueError("not from the apiserver"), 1.0) == 1.0
