"""The one way services reach a Kubernetes cluster: settings, the API client, errors, tracing.

Shared by the watcher (CRD watch, status writer, leader election) and the kubernetes provider, so
both find the cluster the same way (``--kubeconfig``, then in-cluster, then ``~/.kube/config``),
fail start-up with the same field-named message, and trace the same way.

Tracing rule (docs/architecture.md, Telemetry): an API call becomes a client span only when a
span is already current. A watch long-poll or a leader-election renewal runs outside any trace;
a root span per renewal would flood the tracing backend with one-span traces that explain
nothing. Calls made while handling a traced event (a status patch, a pod create) join that
event's trace.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.runtime.kube.settings import (
    KubeConfigError,
    KubeFlags,
    KubeSettings,
    settings_from_flags,
)
from services.runtime.observability.telemetry import tracer

__all__ = [
    "KubeConfigError",
    "KubeFlags",
    "KubeSettings",
    "settings_from_flags",
]

_tracer = tracer("egress.kubernetes")
_SERVICE_HOST = "KUBERNETES_SERVICE_HOST"


@dataclass(frozen=True, slots=True)
class Sources:
    """How error messages name the settings: CLI flags, or a providers-config block's fields."""

    kubeconfig: str = "--kubeconfig / KUBECONFIG"
    context: str = "--kube-context / KUBE_CONTEXT"


FLAGS = Sources()


async def new_api_client(
    settings: KubeSettings, *, sources: Sources = FLAGS
) -> k8s_client.ApiClient:
    """An API client for the cluster ``settings`` point at; the caller closes it."""
    configuration = k8s_client.Configuration()
    path = kubeconfig_path(settings, sources=sources)
    if path is None:
        _load_incluster(configuration, sources)
    else:
        await _load_file(path, settings.context, configuration, sources)
    return TracedApiClient(configuration=configuration)


def kubeconfig_path(
    settings: KubeSettings, env: Mapping[str, str] | None = None, *, sources: Sources = FLAGS
) -> str | None:
    """The kubeconfig file to load, or None for the in-cluster credentials."""
    env = os.environ if env is None else env
    if settings.kubeconfig:
        if not os.path.isfile(settings.kubeconfig):
            raise KubeConfigError(
                f"{sources.kubeconfig}: {settings.kubeconfig!r} is not a file; "
                "give the path of a kubeconfig"
            )
        return settings.kubeconfig
    if env.get(_SERVICE_HOST):
        if settings.context:
            raise KubeConfigError(
                f"{sources.context}: {settings.context!r} needs a kubeconfig; in a pod the "
                f"in-cluster credentials have no contexts. Unset it, or set {sources.kubeconfig}"
            )
        return None
    default = os.path.expanduser(k8s_config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION)
    if not os.path.isfile(default):
        raise KubeConfigError(
            f"{sources.kubeconfig} is not set, this is not a pod ({_SERVICE_HOST} is "
            f"unset) and {default} does not exist; set {sources.kubeconfig} to a kubeconfig PATH"
        )
    return default


def _load_incluster(configuration: k8s_client.Configuration, sources: Sources) -> None:
    try:
        k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]  # untyped in the library
            client_configuration=configuration
        )
    except ConfigException as exc:
        raise KubeConfigError(
            f"in-cluster credentials ({_SERVICE_HOST} is set): {exc}; mount the service "
            f"account token (automountServiceAccountToken: true) or set {sources.kubeconfig}"
        ) from exc


async def _load_file(
    path: str, context: str, configuration: k8s_client.Configuration, sources: Sources
) -> None:
    try:
        await k8s_config.load_kube_config(
            config_file=path,
            context=context or None,
            client_configuration=configuration,
            persist_config=False,
        )
    except ConfigException as exc:
        setting = sources.context if context else sources.kubeconfig
        raise KubeConfigError(
            f"{setting}: cannot use {path!r}"
            + (f" with context {context!r}" if context else "")
            + f" ({exc}); check the file with `kubectl --kubeconfig {path} config view`"
        ) from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KubeConfigError(
            f"{sources.kubeconfig}: {path!r} is not a usable kubeconfig ({exc!r})"
        ) from exc


class TracedApiClient(k8s_client.ApiClient):
    """An ApiClient whose requests are client spans, but only inside an existing trace."""

    async def request(  # noqa: PLR0917 - the signature is the library's own
        self,
        method: str,
        url: str,
        query_params: Any = None,
        headers: Any = None,
        post_params: Any = None,
        body: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> Any:
        call = super().request(
            method,
            url,
            query_params=query_params,
            headers=headers,
            post_params=post_params,
            body=body,
            _preload_content=_preload_content,
            _request_timeout=_request_timeout,
        )
        if not trace.get_current_span().get_span_context().is_valid:
            return await call
        path = urlparse(url).path
        attributes = {
            "http.request.method": method,
            "url.path": path,
            "server.address": urlparse(url).hostname or "",
            "k8s.api.resource": resource_of(path),
        }
        with _tracer.start_as_current_span(
            f"{method} {resource_of(path)}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                response = await call
            except ApiException as exc:
                span.set_attribute("http.response.status_code", int(exc.status or 0))
                # A 404 or 409 is an answer the caller expects, not a failed call.
                if exc.status not in (404, 409):
                    span.set_status(Status(StatusCode.ERROR, str(exc.reason or "")))
                raise
            except BaseException as exc:
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
            span.set_attribute("http.response.status_code", int(getattr(response, "status", 0)))
            return response


def resource_of(path: str) -> str:
    """``pods``, ``proxies/status``: a low-cardinality span name from an API path."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        parts = parts[2:]
    elif parts[:1] == ["apis"]:
        parts = parts[3:]
    if parts[:1] == ["namespaces"] and len(parts) > 2:
        parts = parts[2:]
    if not parts:
        return path or "/"
    return parts[0] + ("/" + "/".join(parts[2:]) if len(parts) > 2 else "")


# --------------------------------------------------------------------------- errors


MAX_RETRY_AFTER = 60.0
"""The longest pause an apiserver's ``Retry-After`` can ask of a controller: a larger value is
clamped, so one bad header cannot stall the watcher for hours."""


class KubeApiError(Exception):
    """A Kubernetes API call failed; ``status`` is the HTTP status (0: no answer at all).
    ``retry_after``: the seconds the apiserver asked us to wait (a 429 from API Priority and
    Fairness, some 5xx), 0 when it asked nothing."""

    def __init__(
        self, message: str, *, status: int = 0, reason: str = "", retry_after: float = 0.0
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after


def retry_after(headers: Mapping[str, str] | None) -> float:
    """Seconds from a ``Retry-After`` header: a whole number of seconds, as the apiserver
    sends it, at most ``MAX_RETRY_AFTER``; 0 when absent, a date, or anything else."""
    if not headers:
        return 0.0
    raw = headers.get("Retry-After") or headers.get("retry-after") or ""
    text = str(raw).strip()
    if not text.isascii() or not text.isdigit():
        return 0.0
    return min(float(int(text[:6])), MAX_RETRY_AFTER)


def pause_after(exc: BaseException, default: float) -> float:
    """How long to wait before calling the apiserver again after ``exc``: what it asked for,
    when that is longer than ``default``."""
    asked = exc.retry_after if isinstance(exc, KubeApiError) else 0.0
    return max(default, asked)


class KubeNotFound(KubeApiError):
    """404: the object (or its namespace) does not exist."""


class KubeConflict(KubeApiError):
    """409: it exists already, or a resourceVersion precondition failed."""


class KubeGone(KubeApiError):
    """410: the resourceVersion is too old; list again."""


class KubeForbidden(KubeApiError):
    """403: RBAC refused, or an admission rule such as a ResourceQuota did."""


class KubeInvalid(KubeApiError):
    """422 (or 400): the object was rejected as malformed."""


class KubeUnavailable(KubeApiError):
    """5xx, 429, or no answer: worth retrying later."""


_BY_STATUS: dict[int, type[KubeApiError]] = {
    404: KubeNotFound,
    409: KubeConflict,
    410: KubeGone,
    401: KubeForbidden,
    403: KubeForbidden,
    400: KubeInvalid,
    422: KubeInvalid,
    429: KubeUnavailable,
}


def status_message(exc: ApiException) -> tuple[str, str]:
    """``(reason, message)`` from the Status object the apiserver puts in an error body."""
    raw: object = exc.body
    body = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw or "")
    try:
        decoded: object = json.loads(body) if body else {}
    except ValueError:
        decoded = {}
    status: dict[str, Any] = decoded if isinstance(decoded, dict) else {}
    reason = str(status.get("reason") or exc.reason or "")
    message = str(status.get("message") or body or exc.reason or "")
    return reason, message


def classify_api_error(exc: ApiException, what: str = "") -> KubeApiError:
    """Our error for an ApiException, by status; raise it ``from exc``."""
    status = int(exc.status or 0)
    reason, message = status_message(exc)
    cls = _BY_STATUS.get(status) or (KubeUnavailable if status >= 500 or status == 0 else None)
    cls = cls or KubeApiError
    prefix = f"{what}: " if what else ""
    return cls(
        f"{prefix}HTTP {status} {reason}: {message}",
        status=status,
        reason=reason,
        retry_after=retry_after(exc.headers),
    )
