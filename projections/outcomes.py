"""What holders reported about a proxy, and the back-offs their ``blocked`` reports started.

Part of the lease fold (``projections.lease``): pure, no clock. A ``blocked`` report for
(proxy, target) keeps the proxy from that target for the back-off the report carries (the
writer's ``--block-backoff``), doubled for each further consecutive ``blocked`` report of the
pair, never more than ``MAX_BLOCK_BACKOFF_SECONDS``; a ``success`` report for the pair ends it.
Because the base is in the event and every time is the event's JetStream timestamp, every
replica and every rebuild computes the same back-off (docs/api.md, "Outcomes").

``failed`` reports are about the proxy, not a target: they are counted in a streak that a
``success`` or ``blocked`` report (the proxy forwarded, the target answered) resets. The health
service probes a proxy at once when its streak reaches its ``--failed-reports-recheck``.

A target is compared by host name (``target_key``): ``https://Shop.example.com/cart`` and
``shop.example.com:443`` are one target, because a site blocks an address, not a URL.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import msgspec

from events.schemas import MAX_BLOCK_BACKOFF_SECONDS, MAX_TARGET_LENGTH

SUCCESS = "success"
BLOCKED = "blocked"
FAILED = "failed"

MAX_BACKOFFS = 256
"""(proxy, target) pairs one view remembers; beyond it the pair reported on longest ago goes, so
a crawler reporting on endless hosts cannot grow a view without bound."""
MAX_DOUBLINGS = 32
"""Enough to reach any cap from any base above 1e-9 s; keeps ``2 ** n`` a small number."""


def target_key(target: str) -> str:
    """The host name a target names, lower-cased, without port, path or trailing dot; "" when
    it names none (the caller decides whether that is an error)."""
    text = target.strip().lower()
    if not text:
        return ""
    try:
        host = urlsplit(text if "://" in text else f"//{text}").hostname or ""
    except ValueError:
        return ""  # an unbalanced IPv6 bracket, say
    host = host.rstrip(".")
    return host if len(host) <= MAX_TARGET_LENGTH else ""


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    target: str
    blocks: int
    """Consecutive ``blocked`` reports for the pair since its last ``success``."""
    until: datetime
    """The proxy is not leased for this target before then (it may be in the past)."""
    reported_at: datetime
    """The last ``blocked`` report's timestamp: the oldest pair is forgotten first."""


class Reports(msgspec.Struct, frozen=True, kw_only=True):
    success: int = 0
    blocked: int = 0
    failed: int = 0
    failed_streak: int = 0
    """Consecutive ``failed`` reports, reset by a ``success`` or ``blocked`` one."""
    backoffs: dict[str, Backoff] = msgspec.field(default_factory=dict)
    """target -> its back-off; never changed in place (the fold copies it)."""


def backoff_seconds(base: float, blocks: int) -> float:
    """The back-off after ``blocks`` consecutive blocked reports with a first back-off of
    ``base``: ``base``, then doubling, at most ``MAX_BLOCK_BACKOFF_SECONDS``."""
    if base <= 0 or blocks <= 0:
        return 0.0
    return min(base * 2.0 ** min(blocks - 1, MAX_DOUBLINGS), MAX_BLOCK_BACKOFF_SECONDS)


def usable_base(value: object) -> float | None:
    """A report's ``backoff_seconds`` if a fold can use it: a finite number within bounds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    base = float(value)
    if not math.isfinite(base) or not 0 <= base <= MAX_BLOCK_BACKOFF_SECONDS:
        return None
    return base


def _end(at: datetime, seconds: float) -> datetime:
    try:
        return at + timedelta(seconds=seconds)
    except OverflowError:
        return datetime.max.replace(tzinfo=at.tzinfo)


def record(reports: Reports, outcome: str, target: str, base: float, at: datetime) -> Reports:
    """``reports`` after one report (``base`` already checked by ``usable_base``). An outcome
    this build does not know is not counted."""
    key = target_key(target)
    match outcome:
        case "success":
            backoffs = reports.backoffs
            if key in backoffs:
                backoffs = {t: b for t, b in backoffs.items() if t != key}
            return msgspec.structs.replace(
                reports, success=reports.success + 1, failed_streak=0, backoffs=backoffs
            )
        case "blocked":
            backoffs = reports.backoffs
            if key:
                blocks = backoffs[key].blocks + 1 if key in backoffs else 1
                backoff = Backoff(
                    target=key,
                    blocks=blocks,
                    until=_end(at, backoff_seconds(base, blocks)),
                    reported_at=at,
                )
                backoffs = {**backoffs, key: backoff}
                if len(backoffs) > MAX_BACKOFFS:
                    oldest = min(backoffs.values(), key=lambda b: (b.reported_at, b.target))
                    del backoffs[oldest.target]
            return msgspec.structs.replace(
                reports, blocked=reports.blocked + 1, failed_streak=0, backoffs=backoffs
            )
        case "failed":
            return msgspec.structs.replace(
                reports, failed=reports.failed + 1, failed_streak=reports.failed_streak + 1
            )
        case _:
            return reports


def blocked_until(reports: Reports, target: str) -> datetime | None:
    """When the back-off of ``target`` (a ``target_key``) ends; None without one."""
    if not target:
        return None
    backoff = reports.backoffs.get(target)
    return backoff.until if backoff is not None else None


def active_backoffs(reports: Reports, now: datetime) -> list[Backoff]:
    """The back-offs still running at ``now``, the longest-running last."""
    return sorted((b for b in reports.backoffs.values() if b.until > now), key=lambda b: b.until)
