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
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

log = structlog.get_logger("egress.discovery")


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    error: str
    """A stable, machine-readable code (``unknown_lease``, ``no_proxy_available``, ...)."""
    message: str
    """What went wrong, for a person."""


class ApiError(Exception):
    status = 400
    code = "invalid_request"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class InvalidRequest(ApiError):
    pass


class UnknownLease(ApiError):
    status = 404
    code = "unknown_lease"


class UnknownProxy(ApiError):
    status = 404
    code = "unknown_proxy"


class NoProxyAvailable(ApiError):
    status = 503
    code = "no_proxy_available"


class NoMatchingProxy(ApiError):
    """No proxy has the attributes asked for: waiting will not help, the selector is wrong."""

    status = 422
    code = "no_matching_proxy"


class LeaseEnded(ApiError):
    """An Idempotency-Key sent again after the lease it acquired has ended."""

    status = 409
    code = "lease_ended"


class IdempotencyKeyMismatch(ApiError):
    """An Idempotency-Key sent again with another body: a different request under an old key."""

    status = 422
    code = "idempotency_key_mismatch"


class Unavailable(ApiError):
    status = 503
    code = "unavailable"


STORE_RETRY_AFTER = "2"
"""``Retry-After`` while the event log is unreachable: about when a reconnection is tried."""


CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "request_timeout",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "unprocessable",
    429: "too_many_requests",
    500: "internal",
    503: "unavailable",
}


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
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
    return error_response(status, CODES.get(status, f"http_{status}"), message, exc.headers)


def on_store_unavailable(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    """The log did not take the write: the client is told so at once, and the write can never
    take effect later (docs/api.md, "When NATS is unreachable")."""
    log.warning(
        "event log unavailable", method=request.method, path=request.url.path, error=str(exc)
    )
    return error_response(
        503,
        "unavailable",
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
        HTTP_500_INTERNAL_SERVER_ERROR, "internal", "the request failed; the error is logged"
    )
