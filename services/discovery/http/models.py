"""What the API accepts and answers, as msgspec Structs (Litestar validates and documents them).

Field names are lowerCamel on the wire (``ttlSeconds``, ``acquiredAt``), like the Kubernetes
resources the same operators read: one naming style whichever of the two they look at.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from events.schemas import MAX_LEASE_SECONDS, Condition
from projections.lease import LeaseRecord, LeaseView
from projections.lease_queries import available_at, is_available, is_free
from projections.meter import Bytes, Spent
from projections.outcomes import Reports, active_backoffs
from projections.proxy import ProxyView
from services.discovery.leasing.credentials import LeaseCredentials
from services.discovery.pure.candidates import CandidateIndex
from services.discovery.pure.egress_shown import EgressShown, shown_in
from services.discovery.pure.targets import check_target
from services.runtime.pure.poolref import MAX_POOL_REF

AttributeKey = Annotated[str, Meta(min_length=1, max_length=63)]
AttributeValue = Annotated[str, Meta(max_length=256)]
Selector = dict[AttributeKey, AttributeValue]
OutcomeName = Literal["success", "blocked", "failed"]
MIN_TTL = 1.0
"""The shortest lease: anything shorter would be over before its holder could use it."""
ProxyUid = Annotated[str, Meta(min_length=1, max_length=253)]
MAX_WAIT_SECONDS = 60.0
"""The longest a lease request may wait for a proxy: below the usual HTTP client timeouts."""
MAX_EXCLUDED = 1000
"""Uids one request may exclude: far more than a crawler tries before it gives up on a target."""
TTL_SECONDS = Meta(
    ge=MIN_TTL,
    le=MAX_LEASE_SECONDS,
    description="Seconds, from 1 to 604800 (7 days); a JSON number, never a "
    "string. Above the server's maximum the lease is granted for the maximum "
    "(ttlClamped). Null or absent: 300, or the maximum if lower.",
)


class _In(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    """Request bodies: an unknown field is refused, so a misspelt ``ttlSecnds`` is an error
    rather than a silently default lease."""


class _Out(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pass


def _target(target: str) -> None:
    """A ``target`` names a host (``pure.targets``), checked as the body is decoded so that a
    refused one never reaches the log; the message starts with the field (``bodies.problem``)."""
    try:
        check_target(target)
    except ValueError as exc:
        raise ValueError(f"target: {exc}") from None


class AcquireRequest(_In, frozen=True, kw_only=True):
    selector: Selector = msgspec.field(default_factory=dict)
    """Attributes the proxy must have, all of them (``{"country": "de"}``)."""
    ttl_seconds: Annotated[float, TTL_SECONDS] | None = None
    """How long the lease lasts unless released: 1 s to 7 days (default 300 s, or the maximum
    if lower). More than the server's maximum (``--max-lease-ttl``) is granted as the maximum:
    the answer says ``ttlClamped``. A number, never a string."""
    holder: Annotated[str, Meta(max_length=256)] = ""
    """Who holds the lease (a crawler's name), recorded in the log and shown in the lease."""
    exclude: Annotated[list[ProxyUid], Meta(max_length=MAX_EXCLUDED)] = msgspec.field(
        default_factory=list
    )
    """Uids of proxies the lease must not be on (say, those a target has just blocked)."""
    proxy_uid: ProxyUid | None = None
    """One particular proxy (to resume a session on the same IP): that one or none. Not free:
    503 with ``Retry-After``; unknown: 404 ``unknown_proxy``."""
    target: Annotated[str, Meta(max_length=2048)] = ""
    """The host (or a URL of it) the holder will reach: proxies that host has blocked (a
    ``blocked`` report for it, still in back-off) are not leased for it. Empty: any proxy."""
    wait_seconds: Annotated[float, Meta(ge=0, le=MAX_WAIT_SECONDS)] = 0.0
    """When no proxy is free: how long to wait for one (0 to 60 s; 0, the default, answers 503
    at once). Waiting requests of one replica are served first come, first served."""
    pool: Annotated[str, Meta(max_length=MAX_POOL_REF)] | None = None
    """A ProxyPool, ``NAMESPACE/NAME`` (``crawl/de``; ``NAME`` alone: the namespace ``default``):
    only its members, the proxies carrying its ``pool`` attribute in its namespace, besides the
    selector. Unknown: 404 ``unknown_pool``; a 503 says whether the pool is scaling."""

    def __post_init__(self) -> None:
        _target(self.target)


class RenewRequest(_In, frozen=True, kw_only=True):
    ttl_seconds: Annotated[float, TTL_SECONDS] | None = None
    """How long the lease lasts from now on: as on a lease request, clamped to the maximum."""


class ReportRequest(_In, frozen=True, kw_only=True):
    outcome: OutcomeName
    """``success``, ``blocked`` (the target refused the proxy's IP) or ``failed``."""
    target: Annotated[str, Meta(max_length=2048)] = ""
    """What the holder reached through the proxy: a host name, or an http(s) URL of one (labels
    of letters, digits and inner hyphens, or an IP address); anything else is a 400."""
    detail: Annotated[str, Meta(max_length=1024)] = ""
    """Free text, e.g. ``HTTP 403``."""

    def __post_init__(self) -> None:
        _target(self.target)


class ConditionOut(_Out, frozen=True, kw_only=True):
    type: str
    status: str
    reason: str
    message: str


class ProxyOut(_Out, frozen=True, kw_only=True, omit_defaults=True):
    uid: str
    namespace: str
    name: str
    url: str
    ip: str
    phase: str
    healthy: bool | None
    """None until a health prober has reported on the proxy."""
    latency_ms: float | None
    """The probe latency of the last health change; None until probed."""
    attributes: dict[str, str]
    provider: str
    conditions: list[ConditionOut]
    leased: bool
    """A lease holds the proxy now."""
    available: bool
    """It could be leased now: Ready, healthy, not leased, not cooling down."""
    cooldown_until: datetime | None
    """While the proxy rests after a lease: when it can be leased again."""
    reports: ReportsOut
    backoff_count: int
    """Targets the proxy is in back-off for now (``GET /v1/proxies/{uid}`` lists them)."""
    egress: EgressShown | None = None
    """What a site sees of the proxy; absent until a check has found something (or while its
    egress keeps it from being leased before any check)."""
    bytes: BytesOut | None = None
    """What an upstream proxy moved today (UTC), as its provider's meter counts it; absent
    before its first byte of the day (D162)."""
    budget: BudgetOut | None = None
    """Present while its provider's budget is spent today: then it is not leased."""


class BytesOut(_Out, frozen=True, kw_only=True):
    up: int
    """Received from the crawlers today."""
    down: int
    """Sent to the crawlers today."""


class BudgetOut(_Out, frozen=True, kw_only=True):
    provider: str
    used_today: int
    """The provider entry's bytes (up and down) today."""
    bytes_per_day: int
    """Its ``maxBytesPerDay``, as the day's latest meter record carried it."""
    resets_at: datetime
    """The next 00:00 UTC: from then on its proxies are leased again."""
    not_leasable_because: str = "budget_spent"
    seen: str = ""
    """The same in words, as a refusal says it."""


def budget_out(spent: Spent | None) -> BudgetOut | None:
    if spent is None:
        return None
    return BudgetOut(
        provider=spent.provider,
        used_today=spent.used,
        bytes_per_day=spent.budget,
        resets_at=spent.resets_at,
        seen=spent.words(),
    )


def bytes_out(moved: Bytes) -> BytesOut | None:
    return BytesOut(up=moved.up, down=moved.down) if moved.total else None


class ReportsOut(_Out, frozen=True, kw_only=True):
    """Outcome reports about the proxy that the LEASE stream still holds."""

    success: int
    blocked: int
    failed: int
    failed_streak: int
    """Consecutive ``failed`` reports: at the health service's ``--failed-reports-recheck``
    the proxy is probed at once."""


class BackoffOut(_Out, frozen=True, kw_only=True):
    target: str
    until: datetime
    """The proxy is not leased for this target before then."""
    blocks: int
    """Consecutive ``blocked`` reports for the target; each doubles the back-off."""


class ProxyDetail(ProxyOut, frozen=True, kw_only=True):
    backoffs: list[BackoffOut]
    """The targets the proxy is in back-off for now, soonest over first."""


CONTINUE_DOC = (
    "Where the next page starts: send it back as ?continue= with the same filters; empty on "
    "the last page (and when no limit was sent). Opaque: one that does not decode or was made "
    "for other filters answers 400 invalid_continue (start the listing again)."
)
TOTAL_DOC = "How many rows match the filters now, on every page."


class ProxyList(_Out, frozen=True, kw_only=True):
    items: list[ProxyOut]
    continue_: Annotated[str, Meta(description=CONTINUE_DOC)] = msgspec.field(
        default="", name="continue"
    )
    """Where the next page starts (``?continue=``); empty on the last page."""
    total: Annotated[int, Meta(description=TOTAL_DOC)] = 0
    """Proxies matching the filters, whatever the page."""


class LeasedProxy(_Out, frozen=True, kw_only=True, omit_defaults=True):
    uid: str
    namespace: str
    name: str
    url: str
    """Where the holder sends its traffic: ``http://<lease id>:<password>@ip:port`` when the
    proxies enforce leases, ``http://ip:port`` otherwise. The password changes on renewal."""
    ip: str
    attributes: dict[str, str]
    egress: EgressShown | None = None
    """What a site sees of the proxy (as on ``GET /v1/proxies``); absent before any finding."""


class OutcomeOut(_Out, frozen=True, kw_only=True):
    outcome: str
    target: str
    detail: str
    at: datetime


class LeaseOut(_Out, frozen=True, kw_only=True):
    id: str
    proxy: LeasedProxy
    acquired_at: datetime
    expires_at: datetime
    fencing_token: int
    """The ``LEASE`` stream sequence of the lease's grant: strictly increasing per proxy, on
    every replica and after older events age out (JetStream never reuses a sequence), but not
    consecutive. A downstream system can refuse a holder whose token is lower than one it has
    already seen; only a deleted and recreated stream starts again (docs/api.md, Guarantees)."""
    ttl_seconds: float
    """The TTL granted."""
    ttl_clamped: bool
    """True when the request asked for more than the server's maximum lease TTL."""
    holder: str
    selector: dict[str, str]
    outcomes: list[OutcomeOut]
    renewed_at: datetime | None = None
    """When the lease was last renewed (the log's time); None while never renewed."""


class LeaseList(_Out, frozen=True, kw_only=True):
    items: list[LeaseOut]
    """A holder's active leases, oldest first."""
    continue_: Annotated[str, Meta(description=CONTINUE_DOC)] = msgspec.field(
        default="", name="continue"
    )
    total: Annotated[int, Meta(description=TOTAL_DOC)] = 0
    """The holder's active leases the caller may see, whatever the page."""


class Released(_Out, frozen=True, kw_only=True):
    released: int
    """How many active leases this request released."""


class Health(_Out, frozen=True, kw_only=True):
    status: str


def _condition(condition: Condition) -> ConditionOut:
    return ConditionOut(
        type=condition.type,
        status=condition.status,
        reason=condition.reason,
        message=condition.message,
    )


def probe_latency(proxy: ProxyView) -> float | None:
    """The latency the last verdict recorded, when it said healthy: a failed probe has none."""
    verdict = proxy.verdict
    return verdict.latency_ms if verdict is not None and verdict.healthy else None


def egress_of(proxy: ProxyView | None, candidates: CandidateIndex) -> EgressShown | None:
    """The proxy's egress as discovery judges it: its policy, and its index of who shares an
    address."""
    if proxy is None:
        return None
    return shown_in(proxy, candidates.policy, candidates.egress)


def proxy_out(
    proxy: ProxyView,
    view: LeaseView | None,
    now: datetime,
    *,
    eligible: bool,
    egress: EgressShown | None = None,
    moved: Bytes | None = None,
    spent: Spent | None = None,
) -> ProxyOut:
    leased = not is_free(view, now)
    cooldown = None if leased else available_at(view)
    return ProxyOut(
        uid=proxy.uid,
        namespace=proxy.namespace,
        name=proxy.name,
        url=proxy.url,
        ip=proxy.ip,
        phase=str(proxy.phase),
        healthy=proxy.healthy,
        latency_ms=probe_latency(proxy),
        attributes=dict(proxy.spec.attributes),
        provider=proxy.spec.provider,
        conditions=[_condition(c) for c in proxy.conditions],
        leased=leased,
        available=eligible and is_available(view, now),
        cooldown_until=cooldown if cooldown is not None and cooldown > now else None,
        reports=reports_out(view.reports if view else Reports()),
        backoff_count=len(active_backoffs(view.reports, now)) if view else 0,
        egress=egress,
        bytes=bytes_out(moved) if moved is not None else None,
        budget=budget_out(spent),
    )


def reports_out(reports: Reports) -> ReportsOut:
    return ReportsOut(
        success=reports.success,
        blocked=reports.blocked,
        failed=reports.failed,
        failed_streak=reports.failed_streak,
    )


def proxy_detail(out: ProxyOut, view: LeaseView | None, now: datetime) -> ProxyDetail:
    backoffs = active_backoffs(view.reports, now) if view else []
    return ProxyDetail(
        **msgspec.structs.asdict(out),
        backoffs=[BackoffOut(target=b.target, until=b.until, blocks=b.blocks) for b in backoffs],
    )


def lease_out(
    record: LeaseRecord,
    proxy: ProxyView | None,
    credentials: LeaseCredentials | None = None,
    egress: EgressShown | None = None,
) -> LeaseOut:
    """With ``credentials``, the proxy URL carries the lease's (D84)."""
    url = proxy.url if proxy else ""
    if proxy is not None and credentials is not None:
        url = credentials.url(proxy, record)
    return LeaseOut(
        id=record.lease_id,
        proxy=LeasedProxy(
            uid=record.proxy_uid,
            namespace=proxy.namespace if proxy else "",
            name=proxy.name if proxy else "",
            url=url,
            ip=proxy.ip if proxy else "",
            attributes=dict(proxy.spec.attributes) if proxy else {},
            egress=egress,
        ),
        acquired_at=record.acquired_at,
        expires_at=record.expires_at,
        fencing_token=record.fencing_token,
        ttl_seconds=record.ttl_seconds,
        ttl_clamped=record.requested_ttl_seconds > record.ttl_seconds,
        holder=record.holder,
        selector=dict(record.selector),
        outcomes=[
            OutcomeOut(outcome=o.outcome, target=o.target, detail=o.detail, at=o.at)
            for o in record.outcomes
        ],
        renewed_at=record.renewed_at,
    )
