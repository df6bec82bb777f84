"""Every error code of the discovery API, with its HTTP status: the one table.

The server's exceptions take their status from here, the CLI and the metrics name codes from
here, and tests hold the client library's copy (it may not import the product), the OpenAPI
document and docs/api.md's table to it (docs/api.md, "Errors").
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """The ``error`` of an answer that is not a success: stable, for programs to act on."""

    INVALID_REQUEST = "invalid_request"
    INVALID_CONTINUE = "invalid_continue"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_YOUR_LEASE = "not_your_lease"
    NOT_FOUND = "not_found"
    UNKNOWN_PROXY = "unknown_proxy"
    UNKNOWN_LEASE = "unknown_lease"
    UNKNOWN_POOL = "unknown_pool"
    NO_ROTATION = "no_rotation"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    NOT_ACCEPTABLE = "not_acceptable"
    REQUEST_TIMEOUT = "request_timeout"
    LEASE_ENDED = "lease_ended"
    LEASE_REVOKED = "lease_revoked"
    NOT_ROTATABLE = "not_rotatable"
    BODY_TOO_LARGE = "body_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    NO_MATCHING_PROXY = "no_matching_proxy"
    IDEMPOTENCY_KEY_MISMATCH = "idempotency_key_mismatch"
    UNPROCESSABLE = "unprocessable"
    LEASE_LIMIT = "lease_limit"
    TOO_MANY_REQUESTS = "too_many_requests"
    INTERNAL = "internal"
    NO_PROXY_AVAILABLE = "no_proxy_available"
    UNAVAILABLE = "unavailable"


STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INVALID_CONTINUE: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_YOUR_LEASE: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNKNOWN_PROXY: 404,
    ErrorCode.UNKNOWN_LEASE: 404,
    ErrorCode.UNKNOWN_POOL: 404,
    ErrorCode.NO_ROTATION: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.NOT_ACCEPTABLE: 406,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.LEASE_ENDED: 409,
    ErrorCode.NOT_ROTATABLE: 409,
    ErrorCode.LEASE_REVOKED: 410,
    ErrorCode.BODY_TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.NO_MATCHING_PROXY: 422,
    ErrorCode.IDEMPOTENCY_KEY_MISMATCH: 422,
    ErrorCode.UNPROCESSABLE: 422,
    ErrorCode.LEASE_LIMIT: 429,
    ErrorCode.TOO_MANY_REQUESTS: 429,
    ErrorCode.INTERNAL: 500,
    ErrorCode.NO_PROXY_AVAILABLE: 503,
    ErrorCode.UNAVAILABLE: 503,
}
"""Every code's status; a code answers with exactly one."""

FOR_STATUS: dict[int, ErrorCode] = {
    400: ErrorCode.INVALID_REQUEST,
    401: ErrorCode.UNAUTHORIZED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    406: ErrorCode.NOT_ACCEPTABLE,
    408: ErrorCode.REQUEST_TIMEOUT,
    413: ErrorCode.BODY_TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    422: ErrorCode.UNPROCESSABLE,
    429: ErrorCode.TOO_MANY_REQUESTS,
    500: ErrorCode.INTERNAL,
    503: ErrorCode.UNAVAILABLE,
}
"""The code of a refusal the framework made (unknown route, body too large, ...): the generic
code of its status."""

MEANING: dict[ErrorCode, str] = {
    ErrorCode.INVALID_REQUEST: "the body or a parameter is not valid; the message names the field",
    ErrorCode.INVALID_CONTINUE: "the `continue` token does not decode or was made for another "
    "listing or other filters; start the listing again without it",
    ErrorCode.UNAUTHORIZED: "the bearer token is missing or wrong",
    ErrorCode.FORBIDDEN: "the client lacks the route's scope, or its clients-file entry does "
    "not allow the selector",
    ErrorCode.NOT_YOUR_LEASE: "another client acquired the lease",
    ErrorCode.NOT_FOUND: "no such route",
    ErrorCode.UNKNOWN_PROXY: "no such proxy (for a lease request, the `proxyUid` asked for)",
    ErrorCode.UNKNOWN_LEASE: "no such lease: never issued, released or expired",
    ErrorCode.UNKNOWN_POOL: "no such pool (for a lease request, the `pool` asked for)",
    ErrorCode.NO_ROTATION: "the lease never asked for a rotation",
    ErrorCode.METHOD_NOT_ALLOWED: "the route exists, the method does not",
    ErrorCode.NOT_ACCEPTABLE: "the `Accept` header asks for a type the route cannot answer",
    ErrorCode.REQUEST_TIMEOUT: "the body did not arrive in time; the connection is closed",
    ErrorCode.LEASE_ENDED: "the lease this Idempotency-Key acquired is over; use a new key",
    ErrorCode.NOT_ROTATABLE: "the lease's proxy is being deleted or External",
    ErrorCode.LEASE_REVOKED: "the system ended the lease under its holder: its proxy is being "
    "deleted, or left the pool it was leased from (the message says which); lease another",
    ErrorCode.BODY_TOO_LARGE: "the body is over 64 KiB",
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: "the body's `Content-Type` is not one the route reads",
    ErrorCode.NO_MATCHING_PROXY: "no proxy has the selector's attributes (the message names "
    "those that exist)",
    ErrorCode.IDEMPOTENCY_KEY_MISMATCH: "the Idempotency-Key was sent before with another body",
    ErrorCode.UNPROCESSABLE: "the request is well formed but cannot be carried out",
    ErrorCode.LEASE_LIMIT: "the client holds as many leases as its `maxLeases`; release one",
    ErrorCode.TOO_MANY_REQUESTS: "too many requests of this kind at once; see `Retry-After`",
    ErrorCode.INTERNAL: "a bug: details are in the service's log, under the request's trace id",
    ErrorCode.NO_PROXY_AVAILABLE: "proxies match but none can be leased now (the message "
    "counts why)",
    ErrorCode.UNAVAILABLE: "the event log is unreachable and nothing was done",
}
"""What each code means, for the OpenAPI document's responses."""

RETRY_LATER = frozenset(
    {ErrorCode.NO_PROXY_AVAILABLE, ErrorCode.LEASE_LIMIT, ErrorCode.UNAVAILABLE}
)
"""Codes that carry ``Retry-After``: the same request may succeed later."""


def describe(status: int) -> str:
    """The codes a status answers with, and what each means: one OpenAPI response's text."""
    codes = [code for code, its in STATUS.items() if its == status]
    text = "; ".join(f"`{code.value}`: {MEANING[code]}" for code in codes)
    if any(code in RETRY_LATER for code in codes):
        text += "; with `Retry-After` in seconds"
    return text or f"error ({status})"
