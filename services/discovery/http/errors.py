"""One error shape for every answer that is not a success: ``{"error": code, "message": text}``.

``ApiError`` is what the lease logic raises; Litestar's own exceptions (unknown route, wrong
method, a body too large or invalid, no token) and anything unexpected are mapped onto the same
shape here, so a client parses exactly one error format.
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi.datastructures import ResponseSpec

from services.discovery.pure.errorcodes import FOR_STATUS, STATUS, ErrorCode, describe

log = structlog.get_logger("egress.discovery")


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    error: ErrorCode
    """A stable, machine-readable code (``unknown_lease``, ``no_proxy_available``, ...)."""
    message: str
    """What went wrong, for a person."""


class ApiError(Exception):
    """A refusal of the lease logic; a subclass names its code, whose status is the table's."""

    code = ErrorCode.INVALID_REQUEST
    status = STATUS[code]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls.status = STATUS[cls.code]

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class InvalidRequest(ApiError):
    pass


class UnknownLease(ApiError):
    code = ErrorCode.UNKNOWN_LEASE


class UnknownProxy(ApiError):
    code = ErrorCode.UNKNOWN_PROXY


class UnknownPool(ApiError):
    code = ErrorCode.UNKNOWN_POOL


class NoProxyAvailable(ApiError):
    code = ErrorCode.NO_PROXY_AVAILABLE


class PoolBusy(NoProxyAvailable):
    """A 503 for a request naming a pool, which says whether the pool is scaling (more members
    coming, or some not Ready yet): then waiting is likely to help."""

    def __init__(
        self, message: str, *, scaling: bool, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message, headers=headers)
        self.scaling = scaling


class NoMatchingProxy(ApiError):
    """No proxy has the attributes asked for: waiting will not help, the selector is wrong."""

    code = ErrorCode.NO_MATCHING_PROXY


class LeaseEnded(ApiError):
    """An Idempotency-Key sent again after the lease it acquired has ended."""

    code = ErrorCode.LEASE_ENDED


class LeaseRevoked(ApiError):
    """The system ended the lease under its holder (``LeaseReleased.reason``): the proxy is
    being deleted or left its pool, so the lease is gone for a reason its holder could not see
    coming (docs/decisions/0139-the-discovery-api-s-edges.md)."""

    code = ErrorCode.LEASE_REVOKED


class IdempotencyKeyMismatch(ApiError):
    """An Idempotency-Key sent again with another body: a different request under an old key."""

    code = ErrorCode.IDEMPOTENCY_KEY_MISMATCH


class Unavailable(ApiError):
    code = ErrorCode.UNAVAILABLE


def error_responses(*statuses: int) -> dict[int, ResponseSpec]:
    """A route's error answers for the OpenAPI document: each status with its codes' meaning."""
    return {
        status: ResponseSpec(data_container=ErrorBody, description=describe(status))
        for status in statuses
    }


STORE_RETRY_AFTER = "2"
"""``Retry-After`` while the event log is unreachable: about when a reconnection is tried."""


def error_response(
    status: int, code: ErrorCode, message: str, headers: dict[str, str] | None = None
) -> Response[ErrorBody]:
    return Response(
        ErrorBody(error=code, message=message),
        status_code=status,
        headers=headers,
        media_type=MediaType.JSON,
    )


def _validation_message(exc: ValidationException) -> str:
    parts: list[str] = []
    if isinstance(exc.extra, list):
        for item in exc.extra:
            if isinstance(item, dict):
                key = item.get("key")
                text = str(item.get("message", ""))
                parts.append(f"{key}: {text}" if key else text)
    return "; ".join(parts) or exc.detail or "the request is not valid"


def on_api_error(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message, exc.headers)


def on_http_exception(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    if status >= 500:
        return on_unexpected(request, exc)
    message = _validation_message(exc) if isinstance(exc, ValidationException) else exc.detail
    if status == 413:
        limit = request.app.request_max_body_size
        message = "the request body is too large" + (f" ({limit} bytes at most)" if limit else "")
    elif status == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    elif status == 404 and message.strip() in ("", "Not Found"):
        message = f"no route {request.url.path}"
    # A status the table has no code for (none the framework raises today) is still a refusal.
    code = FOR_STATUS.get(status, ErrorCode.INVALID_REQUEST)
    return error_response(status, code, message, exc.headers)


def on_store_unavailable(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    """The log did not take the write: the client is told so at once, and the write can never
    take effect later (docs/api.md, "When NATS is unreachable")."""
    log.warning(
        "event log unavailable", method=request.method, path=request.url.path, error=str(exc)
    )
    return error_response(
        STATUS[ErrorCode.UNAVAILABLE],
        ErrorCode.UNAVAILABLE,
        "the event log (NATS) is unreachable or did not confirm the write in time; try again",
        {"Retry-After": STORE_RETRY_AFTER},
    )


def on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    # Details stay in the log (with the trace ids); the client learns only that it failed.
    log.error(
        "request failed",
        method=request.method,
        path=request.url.path,
        error=str(exc),
        exc_info=exc,
    )
    return error_response(
        STATUS[ErrorCode.INTERNAL], ErrorCode.INTERNAL, "the request failed; the error is logged"
    )
