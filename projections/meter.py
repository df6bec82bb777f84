"""What an upstream provider entry's proxies moved, and whether its daily budget is spent: a fold
of ``meter.<provider>`` (docs/decisions/0162-upstream-budgets.md).

One view per provider entry: bytes up and down per proxy and per lease, on their latest UTC day
("today" when that day is today) and in all the stream still holds, and per UTC day the
provider's bytes with the latest budget a record of that day carried. A record counts on the
UTC day of its server timestamp, not of the ``start`` its replica wrote: the server's clock is
the one no writer can move, and it only goes forward in a stream.

Pure, and trusting nothing in the log: a record ``events.meter.problem`` finds fault with, one
whose provider is not its subject's, another event or an unreadable one is counted in
``unusable`` and left out whole. Each table keeps at most ``MAX_KEYS`` keys (the rest summed
under ``OTHER``), and the view at most ``MAX_DAYS`` days. Folded in place (``apply`` returns the
view it was given): three days of records are millions, a copy per record would cost more than
the sums.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

import msgspec

from events.meter import UpstreamMetered, problem
from events.store import Recorded

MAX_KEYS = 100_000
"""Proxies, or leases, one provider's view counts apart; the rest are summed under ``OTHER``."""
MAX_DAYS = 8
"""UTC days a view keeps (the stream keeps three); older ones go first."""
OTHER = "*"
SUBJECT_PREFIX = "meter."


class Bytes(msgspec.Struct):
    up: int = 0
    """Received from the crawler."""
    down: int = 0
    """Sent to the crawler."""

    @property
    def total(self) -> int:
        return self.up + self.down


class Usage(msgspec.Struct):
    """One proxy's or lease's bytes: on ``day``, its latest UTC day with a record, and in all."""

    day: str = ""
    """ISO date (``2026-12-07``); "" before any record."""
    on_day: Bytes = msgspec.field(default_factory=Bytes)
    total: Bytes = msgspec.field(default_factory=Bytes)

    def on(self, day: str) -> Bytes:
        """The bytes of ``day``: none unless it is the latest day with a record."""
        return self.on_day if self.day == day else Bytes()


class Day(msgspec.Struct):
    """A provider's bytes on one UTC day, and the latest budget a record of the day carried."""

    up: int = 0
    down: int = 0
    budget: int = 0
    """``maxBytesPerDay`` as the day's latest record wrote it; 0: no budget."""

    @property
    def used(self) -> int:
        return self.up + self.down

    @property
    def spent(self) -> bool:
        return self.budget > 0 and self.used >= self.budget


class MeterView(msgspec.Struct):
    provider: str = ""
    """The subject's token: every usable record names this provider."""
    days: dict[str, Day] = msgspec.field(default_factory=dict)
    proxies: dict[str, Usage] = msgspec.field(default_factory=dict)
    leases: dict[str, Usage] = msgspec.field(default_factory=dict)
    """By lease id; bytes no lease made (the prober's) count for the proxy only."""
    records: int = 0
    unusable: int = 0
    last_seq: int = 0


@dataclass(frozen=True, slots=True)
class Spent:
    """A provider whose budget today's bytes have reached: why its proxies are not leased."""

    provider: str
    used: int
    budget: int
    resets_at: datetime
    """The next 00:00 UTC, when a new day's bytes start from nothing."""

    def words(self) -> str:
        return (
            f"provider {self.provider!r} moved {self.used} bytes today, its budget is "
            f"{self.budget} bytes a day (maxBytesPerDay); leasable again at "
            f"{self.resets_at.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        )


def day_of(at: datetime) -> str:
    """The UTC day of ``at``, as the view keys it."""
    return at.astimezone(UTC).date().isoformat()


def next_midnight(at: datetime) -> datetime:
    """00:00 UTC after ``at``: when the day of ``at`` is over."""
    day = at.astimezone(UTC).date() + timedelta(days=1)
    return datetime.combine(day, time(0), tzinfo=UTC)


def provider_of(subject: str) -> str:
    """The projector's key of ``meter.<provider>``: the provider's token."""
    return subject.removeprefix(SUBJECT_PREFIX)


def apply(view: MeterView | None, recorded: Recorded) -> MeterView:
    view = view if view is not None else MeterView(provider=provider_of(recorded.subject))
    view.last_seq = recorded.seq
    event = recorded.event
    if (
        not isinstance(event, UpstreamMetered)
        or problem(event) is not None
        or recorded.subject != SUBJECT_PREFIX + event.provider
        or event.provider != view.provider
    ):
        view.unusable += 1
        return view
    day = day_of(recorded.timestamp)
    view.records += 1
    totals = view.days.get(day)
    if totals is None:
        totals = view.days[day] = Day()
        while len(view.days) > MAX_DAYS:
            del view.days[min(view.days)]
    totals.up += event.bytes_up
    totals.down += event.bytes_down
    totals.budget = event.budget_bytes_per_day
    _add(view.proxies, event.proxy_uid, day, event)
    if event.lease_id:
        _add(view.leases, event.lease_id, day, event)
    return view


def _add(table: dict[str, Usage], key: str, day: str, event: UpstreamMetered) -> None:
    if key not in table and len(table) >= MAX_KEYS:
        key = OTHER
    usage = table.get(key)
    if usage is None:
        usage = table[key] = Usage()
    if day > usage.day:
        usage.day, usage.on_day = day, Bytes()
    if day == usage.day:
        usage.on_day.up += event.bytes_up
        usage.on_day.down += event.bytes_down
    usage.total.up += event.bytes_up
    usage.total.down += event.bytes_down


def fold(records: list[Recorded]) -> dict[str, MeterView]:
    """Every provider's view, as discovery's projector keys them."""
    views: dict[str, MeterView] = {}
    for recorded in records:
        key = provider_of(recorded.subject)
        views[key] = apply(views.get(key), recorded)
    return views


def spent(view: MeterView | None, now: datetime) -> Spent | None:
    """Whether the provider's bytes of ``now``'s UTC day have reached its budget."""
    if view is None:
        return None
    totals = view.days.get(day_of(now))
    if totals is None or not totals.spent:
        return None
    return Spent(view.provider, totals.used, totals.budget, next_midnight(now))


def bytes_on(view: MeterView | None, proxy_uid: str, day: str) -> Bytes:
    """The proxy's bytes on ``day`` as its provider's view counts them."""
    usage = view.proxies.get(proxy_uid) if view is not None else None
    return usage.on(day) if usage is not None else Bytes()
