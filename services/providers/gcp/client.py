"""The real Compute Engine client (``google-cloud-compute``, REST transport), its wire log, and
the translation of its exceptions into the taxonomy.

Credentials are Application Default Credentials (workload identity in a cluster, ``gcloud auth
application-default login`` on a laptop), looked up when the first call needs them, not at
start-up: the lookup may ask the metadata server, and constructors do no I/O. Only a plain
``http://`` ``apiEndpoint`` (a local fake, never Google) is called without credentials, so no
token can ever travel unencrypted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import google.auth
import requests
import structlog
from google.api_core import exceptions as core
from google.auth import exceptions as auth
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import compute_v1
from requests.adapters import HTTPAdapter

from services.providers.base import Permanent, ProviderError, Transient
from services.providers.gcp.config import GcpConfig
from services.providers.gcp.pure import wirelog
from services.providers.gcp.pure.classify import classify

WIRE_LOGGER = "egress.provider.gcp.wire"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
C = TypeVar("C")
wire_log = structlog.get_logger(WIRE_LOGGER)


class WireLogAdapter(HTTPAdapter):
    """Logs each request as it leaves and each response as it arrives, at debug.

    An adapter sees the exact bytes on the wire, the Authorization header the session added and
    error responses included (which the client's interceptors never see); the wirelog rules
    decide what of it is shown. The current span (copied into the worker thread) gives the
    records their traceID and spanID.
    """

    def __init__(self, provider: str, full_payloads: bool | None = None) -> None:
        super().__init__()
        self.provider = provider
        self.full_payloads = full_payloads

    def send(
        self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
    ) -> requests.Response:
        if not logging.getLogger(WIRE_LOGGER).isEnabledFor(logging.DEBUG):
            return super().send(request, *args, **kwargs)
        full = wirelog.full_payloads() if self.full_payloads is None else self.full_payloads
        line = {
            "provider": self.provider,
            "method": request.method,
            "url": wirelog.scrub(request.url or ""),
        }
        wire_log.debug(
            "gcp request",
            **line,
            headers=wirelog.headers(_text_headers(request.headers)),
            body=wirelog.payload(_body(request.body), full=full),
        )
        started = time.perf_counter()
        try:
            response = super().send(request, *args, **kwargs)
        except Exception as exc:
            wire_log.debug(
                "gcp request failed",
                **line,
                error=wirelog.scrub(f"{type(exc).__name__}: {exc}"),
                elapsed_ms=round((time.perf_counter() - started) * 1000, 1),
            )
            raise
        wire_log.debug(
            "gcp response",
            **line,
            status=response.status_code,
            headers=wirelog.headers(response.headers),
            body=wirelog.payload(response.content, full=full),
            elapsed_ms=round((time.perf_counter() - started) * 1000, 1),
        )
        return response


def _text_headers(values: Mapping[str, str | bytes]) -> dict[str, str]:
    return {
        name: value.decode("latin-1") if isinstance(value, bytes) else value
        for name, value in values.items()
    }


def _body(body: object) -> bytes | str | None:
    """The request body when it is in memory (always, for this client); a stream is not read."""
    return body if isinstance(body, bytes | str) else None


def build_client(
    provider: str,
    config: GcpConfig,
    full_payloads: bool | None = None,
    credentials: Credentials | None = None,
) -> compute_v1.InstancesClient:
    """A client for ``config``, with the wire log on its HTTP session. Blocking (ADC lookup).

    ``credentials`` is for tests (a token to see redacted); by default ADC, or none at all for a
    plain-http endpoint.
    """
    return build(compute_v1.InstancesClient, provider, config, full_payloads, credentials)


def build(
    client_class: Callable[..., C],
    provider: str,
    config: GcpConfig,
    full_payloads: bool | None = None,
    credentials: Credentials | None = None,
) -> C:
    """Any Compute client (instances, machine types, images, ...) the way ``build_client``
    builds the instances one: REST, the wire log, no credentials for a plain-http endpoint."""
    credentials = _credentials(config, credentials)
    # Every generated Compute client has the classmethod; Callable cannot say so.
    transport_class = client_class.get_transport_class("rest")  # type: ignore[attr-defined]
    transport = transport_class(
        host=config.api_endpoint.rstrip("/") or "compute.googleapis.com",
        credentials=credentials,
    )
    adapter = WireLogAdapter(provider, full_payloads)
    # The transport offers no hook for its session; its adapters are the one place that sees
    # every request, the authorised ones included.
    transport._session.mount("https://", adapter)
    transport._session.mount("http://", adapter)
    return client_class(transport=transport)


def _credentials(config: GcpConfig, credentials: Credentials | None) -> Credentials | None:
    if credentials is None and config.api_endpoint.startswith("http://"):
        return AnonymousCredentials()  # type: ignore[no-untyped-call]
    return credentials


RESOURCE_MANAGER = "https://cloudresourcemanager.googleapis.com"


def granted_permissions(
    provider: str,
    config: GcpConfig,
    wanted: list[str],
    full_payloads: bool | None = None,
    credentials: Credentials | None = None,
) -> list[str]:
    """Which of ``wanted`` the caller holds on the project: Resource Manager's
    ``projects.testIamPermissions`` (Compute has no project-level check; D140). The Compute
    client has no Resource Manager client, so this is its one REST call, made through
    google-auth's session with the same credentials and wire log; a set ``apiEndpoint`` serves
    it too. Blocking; raises the client's errors, which ``translate`` knows."""
    resolved = _credentials(config, credentials)
    if resolved is None:
        resolved, _ = google.auth.default(scopes=SCOPES)
    session = AuthorizedSession(resolved)  # type: ignore[no-untyped-call]  # google-auth: untyped
    adapter = WireLogAdapter(provider, full_payloads)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    base = config.api_endpoint.rstrip("/") or RESOURCE_MANAGER
    try:
        response = session.post(
            f"{base}/v1/projects/{config.project}:testIamPermissions",
            json={"permissions": wanted},
            timeout=config.timeout_seconds,
        )
        if response.status_code >= 400:
            raise core.from_http_response(response)  # type: ignore[no-untyped-call]  # api-core
        answer = response.json()
    finally:
        session.close()  # type: ignore[no-untyped-call]  # google-auth: untyped
    held = answer.get("permissions", []) if isinstance(answer, dict) else []
    return [str(permission) for permission in held if isinstance(permission, str)]


def reasons(exc: core.GoogleAPICallError) -> list[str]:
    """Every reason an HTTP error names: ``errors[].reason`` and the ErrorInfo reason."""
    found = [str(e.get("reason", "")) for e in exc.errors if isinstance(e, dict)]
    if exc.reason:
        found.append(str(exc.reason))
    return [reason for reason in found if reason]


def already_exists(exc: core.Conflict) -> bool:
    """A 409 on insert is "that name is taken" unless it says otherwise (an operation on the
    name still in progress is a conflict to retry, not an instance to return)."""
    why = {reason.lower() for reason in reasons(exc)}
    return not why or "alreadyexists" in why


def translate(exc: Exception, *, op: str, what: str) -> ProviderError | None:
    """``exc`` as a taxonomy error saying what failed, or None for an exception that is not the
    client's (a bug, which the instrumentation layer reports as such)."""
    if isinstance(exc, core.GoogleAPICallError):
        why = reasons(exc)
        cls = classify(exc.code, why, op=op)
        shown = f" ({', '.join(why)})" if why else ""
        return cls(f"{what}: HTTP {exc.code}{shown}: {exc.message}")
    if isinstance(exc, auth.InvalidOperation):
        # The API answered 401 and the session could not get a fresh token to try again.
        return Permanent(f"{what}: HTTP 401: the credentials were refused ({exc})")
    if isinstance(exc, auth.DefaultCredentialsError):
        return Permanent(
            f"{what}: no Application Default Credentials ({exc}); in a cluster bind the "
            "service account with workload identity, locally run "
            "`gcloud auth application-default login`"
        )
    if isinstance(exc, auth.RefreshError):
        cls_ = Transient if getattr(exc, "retryable", False) else Permanent
        return cls_(f"{what}: the credentials could not be refreshed: {exc}")
    if isinstance(exc, requests.Timeout | core.RetryError | TimeoutError):
        return Transient(f"{what}: timed out: {exc}")
    if isinstance(exc, requests.RequestException | auth.TransportError | OSError):
        return Transient(f"{what}: {type(exc).__name__}: {exc}")
    return None


def operation_error(operation: compute_v1.Operation, *, op: str, what: str) -> ProviderError | None:
    """An operation answered already failed (GCE reports some refusals only inside it)."""
    if not operation.error or not operation.error.errors:
        return None
    codes = [error.code for error in operation.error.errors]
    status = operation.http_error_status_code or None
    cls = classify(status, codes, op=op)
    messages = "; ".join(f"{e.code}: {e.message}" for e in operation.error.errors)
    return cls(f"{what}: the operation failed: {messages}")
