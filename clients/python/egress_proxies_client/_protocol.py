"""What both clients send and how they read the answers, without any I/O.

The sync and the async client differ only in how they wait; the requests, the retry rules, the
meaning of every answer and what a held lease reads (``HeldLeaseBase``) live here once.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from egress_proxies_client.errors import (
    AuthError,
    EgressError,
    Forbidden,
    LeaseEnded,
    LeaseLimit,
    LeaseRevoked,
    NoMatchingProxy,
    NoProxyAvailable,
    RotationFailed,
    Unavailable,
    UnknownLease,
    UnknownPool,
    UnknownProxy,
)
from egress_proxies_client.models import Lease, Proxy, Rotation

RETRY_AFTER_DEFAULT = 1.0
"""Seconds to wait when a 503 carries no usable ``Retry-After``."""
ROTATION_POLL = 0.5
"""Seconds between two reads of a rotation waited for: well inside the server's drain (5 s by
default) between the switch and the old instance's deletion."""
ROTATION_TIMEOUT = 300.0
"""How long ``rotate()`` waits by default: creating and probing an instance takes seconds on a
local provider and a few minutes on a cloud one."""
MAX_BACKOFF = 2.0
"""The longest pause between two attempts of one call: the API's own ``Retry-After`` on an
outage is 2 s (docs/api.md, "When NATS is unreachable")."""


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    path: str
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    extra_timeout: float = 0.0
    """Added to the client's timeout: the time the server may hold the request on purpose."""
    resend_safe: bool = True
    """Whether the request may be sent again after it may have reached the server (an answer
    lost in transit). A report is not: it would be recorded twice. A request that never left
    (connection refused) may always be sent again."""


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """What ``acquire()`` or ``lease()`` was asked for; a held lease renews with its ``ttl``."""

    selector: Mapping[str, str] | None
    ttl: float | None
    target: str | None
    wait: float | None
    holder: str | None
    exclude: tuple[str, ...]
    proxy_uid: str | None
    pool: str | None = None
    """A ProxyPool, ``NAMESPACE/NAME`` (``NAME`` alone: in the namespace ``default``)."""

    def call(self, holder: str, key: str | None = None) -> Call:
        """``holder`` is the client's, used unless the request names one; ``key`` the
        ``Idempotency-Key``, a new one unless given (see ``acquire``)."""
        return acquire(
            selector=self.selector,
            ttl=self.ttl,
            target=self.target,
            wait=self.wait,
            holder=self.holder or holder,
            exclude=self.exclude,
            proxy_uid=self.proxy_uid,
            key=key or str(uuid.uuid4()),
            pool=self.pool,
        )


class HeldLeaseBase:
    """What a held lease reads, the same in ``AsyncHeldLease`` and ``HeldLease``: the request it
    was opened with and the latest answer kept. Each adds only what waits (acquiring, renewing,
    rotating, reporting, releasing), by awaiting or by blocking."""

    _OPEN_WITH = "with client.lease()"
    """How the lease is opened, for the error of a lease read before it is."""

    def __init__(self, request: LeaseRequest) -> None:
        self._request = request
        self._lease: Lease | None = None
        self._closed = False
        self.lost: EgressError | None = None
        """Why the lease is no longer held, once a renewal found it over (or failed until its
        end). Work through the proxy should stop; ``close()`` still does no harm."""

    def _acquire(self, holder: str) -> Call:
        """The acquire call of the lease (``holder``: the client's, unless the request names
        one); once only."""
        if self._lease is not None or self._closed:
            raise RuntimeError("a held lease is opened once; call client.lease() again")
        return self._request.call(holder)

    @property
    def lease(self) -> Lease:
        if self._lease is None:
            raise RuntimeError(f"the lease is not acquired yet: use `{self._OPEN_WITH}`")
        return self._lease

    @property
    def id(self) -> str:
        return self.lease.id

    @property
    def proxy(self) -> Proxy:
        return self.lease.proxy

    @property
    def url(self) -> str:
        """The proxy URL to send the next request through (see ``AsyncHeldLease``)."""
        return self.lease.proxy.url

    @property
    def target(self) -> str | None:
        return self._request.target


def acquire(
    *,
    selector: Mapping[str, str] | None,
    ttl: float | None,
    target: str | None,
    wait: float | None,
    holder: str,
    exclude: Iterable[str],
    proxy_uid: str | None,
    key: str,
    pool: str | None = None,
) -> Call:
    """``key`` is the ``Idempotency-Key``: the same for every attempt of one logical acquire,
    so a retry after a lost answer gets the lease the first attempt got, never a second one."""
    body: dict[str, Any] = {"selector": dict(selector or {}), "holder": holder}
    if ttl is not None:
        body["ttlSeconds"] = ttl
    if target:
        body["target"] = target
    if wait:
        body["waitSeconds"] = wait
    excluded = list(exclude)
    if excluded:
        body["exclude"] = excluded
    if proxy_uid:
        body["proxyUid"] = proxy_uid
    if pool is not None:
        body["pool"] = pool
    return Call("POST", "/v1/leases", body, {"Idempotency-Key": key}, extra_timeout=wait or 0.0)


def get(lease_id: str) -> Call:
    return Call("GET", f"/v1/leases/{_segment(lease_id)}")


def renew(lease_id: str, ttl: float | None) -> Call:
    return Call("PATCH", f"/v1/leases/{_segment(lease_id)}", {"ttlSeconds": ttl})


def release(lease_id: str) -> Call:
    return Call("DELETE", f"/v1/leases/{_segment(lease_id)}")


def report(lease_id: str, outcome: str, target: str | None, detail: str | None) -> Call:
    body = {"outcome": outcome}
    if target:
        body["target"] = target
    if detail:
        body["detail"] = detail[:1024]
    return Call("POST", f"/v1/leases/{_segment(lease_id)}/report", body, resend_safe=False)


def rotate(lease_id: str) -> Call:
    # Resending is safe: a request while a rotation is under way answers that rotation.
    return Call("POST", f"/v1/leases/{_segment(lease_id)}/rotate")


def rotation(lease_id: str) -> Call:
    return Call("GET", f"/v1/leases/{_segment(lease_id)}/rotation")


def settled(answer: Rotation) -> Rotation:
    """A rotation that is over: ``completed`` is the answer, ``failed`` and ``cancelled``
    raise ``RotationFailed``."""
    if answer.state in ("failed", "cancelled"):
        why = f": {answer.message}" if answer.message else ""
        raise RotationFailed(
            f"rotation {answer.id} of lease {answer.lease.id} {answer.state}{why}", rotation=answer
        )
    return answer


def not_over(answer: Rotation, timeout: float) -> TimeoutError:
    return TimeoutError(
        f"rotation {answer.id} of lease {answer.lease.id} still {answer.state} after "
        f"{timeout:g}s; call rotate() again to keep waiting (it answers the rotation under way)"
    )


def newer(held: Lease | None, answer: Lease) -> Lease:
    """The answer to keep for a held lease: a renewal answered before a rotation's switch but
    read after it must not bring back the old instance's URL (its fencing token is lower)."""
    if held is not None and answer.fencing_token < held.fencing_token:
        return held
    return answer


LIST_PAGE = 500
"""Leases asked for per page by ``list_mine``: one answer stays well under a megabyte."""


def list_holder(holder: str, token: str = "", limit: int = LIST_PAGE) -> Call:
    """One page of the holder's leases; ``token``: the previous page's ``continue``."""
    path = f"/v1/leases?holder={quote(holder, safe='')}&limit={limit}"
    return Call("GET", path + (f"&continue={quote(token, safe='')}" if token else ""))


def next_page(answer: Any) -> str:
    """The ``continue`` of a listing's answer: "" on its last page, and from a server that
    does not page (it answers everything at once)."""
    token = answer.get("continue", "") if isinstance(answer, dict) else ""
    return token if isinstance(token, str) else ""


def release_holder(holder: str) -> Call:
    return Call("DELETE", f"/v1/leases?holder={quote(holder, safe='')}")


def _segment(lease_id: str) -> str:
    if not lease_id:
        raise ValueError("lease_id: empty; pass the id of a lease this client acquired")
    return quote(lease_id, safe="")


def backoff(attempt: int, retry_after: float = RETRY_AFTER_DEFAULT) -> float:
    """Seconds before attempt ``attempt + 1``: doubling from 0.25 s, within the server's hint."""
    return min(0.25 * 2.0**attempt, retry_after, MAX_BACKOFF)


def decode(status: int, headers: Mapping[str, str], content: bytes, base: str) -> Any:
    """The answer's JSON (None for an empty body); an error answer raises what its code means."""
    if 200 <= status < 300:
        return json.loads(content) if content else None
    raise error(status, headers, content, base)


def error(status: int, headers: Mapping[str, str], content: bytes, base: str) -> EgressError:
    try:
        answer = json.loads(content) if content else {}
    except ValueError:
        answer = {}
    if not isinstance(answer, dict):
        answer = {}
    code = str(answer.get("error", ""))
    message = str(answer.get("message", "")) or f"HTTP {status}"
    kind: dict[str, type[EgressError]] = {
        "no_matching_proxy": NoMatchingProxy,
        "unknown_lease": UnknownLease,
        "lease_ended": LeaseEnded,
        "lease_revoked": LeaseRevoked,
        "unknown_proxy": UnknownProxy,
        "unknown_pool": UnknownPool,
        "unauthorized": AuthError,
        "forbidden": Forbidden,
        "not_your_lease": Forbidden,
    }
    if code == "no_proxy_available":
        return NoProxyAvailable(message, retry_after=retry_after(headers), code=code, status=status)
    if code == "lease_limit":
        return LeaseLimit(message, retry_after=retry_after(headers), code=code, status=status)
    if code == "unavailable" or (status in (502, 503, 504) and not code):
        return Unavailable(
            f"the discovery API at {base} cannot serve now: {message}",
            retry_after=retry_after(headers),
            code=code,
            status=status,
        )
    if code in kind:
        return kind[code](message, code=code, status=status)
    if status == 401:
        return AuthError(message, code=code, status=status)
    return EgressError(f"{message} (HTTP {status})", code=code, status=status)


def retry_after(headers: Mapping[str, str]) -> float:
    """``Retry-After`` in seconds; the API sends whole seconds, never a date."""
    text = headers.get("retry-after", "").strip()
    try:
        value = float(text)
    except ValueError:
        return RETRY_AFTER_DEFAULT
    return value if value >= 0 else RETRY_AFTER_DEFAULT


def unreachable(base: str, exc: Exception) -> Unavailable:
    return Unavailable(
        f"cannot reach the discovery API at {base}: {exc!r}", retry_after=RETRY_AFTER_DEFAULT
    )


def renew_delay(ttl_seconds: float) -> float:
    """When to renew, in seconds after the last answer: at half the TTL, so a renewal that
    fails on an outage has the other half to be retried before the lease ends."""
    return max(ttl_seconds / 2, 0.1)


def default_holder() -> str:
    """A holder name unique to this client: ``release_mine`` then never touches another
    process's leases, while an operator still sees which machine and process held a proxy."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
