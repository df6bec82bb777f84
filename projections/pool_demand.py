"""The demand on a pool: a fold of ``demand.<pool uid>`` (docs/pools.md, "Autoscale").

Each discovery replica reports, while it has any, the lease requests naming the pool that it
could not serve (``PoolDemand``), and once more with nothing when they end. The pool's demand
now is the sum of every replica's last report, as long as that report is fresh: a replica that
died without its last report stops counting after ``STALE_AFTER`` of its reporting intervals.

Pure, and trusting nothing in the log: a report with a negative or absurd count, a non-finite
interval or a reason no discovery writes is counted in ``unusable`` and left out; at most
``MAX_REPLICAS`` replicas are kept per pool (the oldest report goes), so a writer inventing
replica names cannot grow the view without bound.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import msgspec

from events.pool import MAX_REPLICAS as MAX_POOL_REPLICAS
from events.pool import PoolDemand
from events.store import Recorded
from events.subjects import proxy_uid_of

REASONS = ("busy", "scaling")
"""Why a request naming a pool was refused: every member busy, or the pool still growing."""
MAX_REPLICAS = 64
"""Discovery replicas kept per pool."""
MAX_COUNT = 1_000_000
MAX_INTERVAL = 3600.0
STALE_AFTER = 3
"""A report counts for this many of its intervals."""
_REPLICA = re.compile(r"^[A-Za-z0-9_.-]{1,128}\Z")


class Report(msgspec.Struct, frozen=True, kw_only=True):
    at: datetime
    waiting: int
    refused: dict[str, int]
    unserved: int
    interval_seconds: float


class DemandView(msgspec.Struct, frozen=True, kw_only=True):
    uid: str
    reports: dict[str, Report] = msgspec.field(default_factory=dict)
    """replica -> its last report."""
    unusable: int = 0
    last_seq: int = 0


@dataclass(frozen=True, slots=True)
class Demand:
    """What a pool's load lacks now, summed over the replicas' fresh reports."""

    waiting: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    unserved: int = 0


def usable(event: PoolDemand) -> bool:
    counts = (event.waiting, event.unserved, *event.refused.values())
    return (
        bool(_REPLICA.match(event.replica))
        and all(0 <= n <= MAX_COUNT for n in counts)
        and set(event.refused) <= set(REASONS)
        and math.isfinite(event.interval_seconds)
        and 0 < event.interval_seconds <= MAX_INTERVAL
    )


def apply(view: DemandView | None, recorded: Recorded) -> DemandView:
    event = recorded.event
    if not isinstance(event, PoolDemand):
        raise TypeError(f"{type(event).__name__} is no demand event")
    view = view or DemandView(uid=proxy_uid_of(recorded.subject))
    if not usable(event):
        return msgspec.structs.replace(view, unusable=view.unusable + 1, last_seq=recorded.seq)
    reports = dict(view.reports)
    reports[event.replica] = Report(
        at=recorded.timestamp,
        waiting=event.waiting,
        refused=dict(event.refused),
        unserved=event.unserved,
        interval_seconds=event.interval_seconds,
    )
    if len(reports) > MAX_REPLICAS:
        del reports[min(reports, key=lambda r: reports[r].at)]
    return msgspec.structs.replace(view, reports=reports, last_seq=recorded.seq)


def current(view: DemandView | None, now: datetime) -> Demand:
    """The pool's demand at ``now``: the fresh reports summed (bounded by the pool's size limit,
    which is all a pool could use)."""
    if view is None:
        return Demand()
    waiting = unserved = 0
    refused: dict[str, int] = {}
    for report in view.reports.values():
        if now - report.at > timedelta(seconds=STALE_AFTER * report.interval_seconds):
            continue
        waiting += report.waiting
        unserved += report.unserved
        for reason, n in report.refused.items():
            refused[reason] = refused.get(reason, 0) + n
    return Demand(
        waiting=min(waiting, MAX_POOL_REPLICAS),
        refused={r: min(n, MAX_COUNT) for r, n in refused.items()},
        unserved=min(unserved, MAX_POOL_REPLICAS),
    )


def key(subject: str) -> str:
    return proxy_uid_of(subject)
