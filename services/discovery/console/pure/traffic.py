"""The console's traffic figures: the range a page reads, the chart's intervals and its bars
(docs/console.md, "Traffic"; docs/decisions/0159-traffic-in-the-console.md).

Pure: the read (``console.traffic_read``) folds records into a ``projections.traffic`` view and
hands each record's totals to ``Series.add``; the page draws the bars ``chart`` lays out as an
inline SVG, so the chart needs no script and nothing from the network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from projections.traffic import Totals


@dataclass(frozen=True, slots=True)
class Range:
    """How far back from the end a page reads, and the chart's interval."""

    name: str
    seconds: int
    step: int
    label: str


RANGES = {
    "hour": Range("hour", 3600, 60, "last hour, per minute"),
    "day": Range("day", 86_400, 900, "last day, per 15 minutes"),
}
DEFAULT = "hour"


def parse_range(text: str) -> Range:
    """``hour`` (the default, for an empty value) or ``day``; ValueError for anything else."""
    found = RANGES.get(text.strip() or DEFAULT)
    if found is None:
        raise ValueError(f"range: {text[:40]!r} is not one of {', '.join(RANGES)}")
    return found


@dataclass(slots=True)
class Series:
    """Requests and bytes per interval, by the server timestamp of each record."""

    since: datetime
    step: int
    requests: list[int] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)

    def add(self, at: datetime, sums: Totals) -> None:
        index = int((at - self.since).total_seconds() // self.step)
        if 0 <= index < len(self.requests):
            self.requests[index] += sums.requests
            self.bytes[index] += sums.bytes

    def start(self, index: int) -> datetime:
        return self.since + timedelta(seconds=index * self.step)


def series(until: datetime, span: Range) -> Series:
    """Empty intervals covering ``span`` back from ``until``."""
    count = span.seconds // span.step
    since = until - timedelta(seconds=span.seconds)
    return Series(since, span.step, [0] * count, [0] * count)


WIDTH = 600
HEIGHT = 80


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    title: str


@dataclass(frozen=True, slots=True)
class Chart:
    """One row of bars, scaled to its busiest interval."""

    label: str
    peak: str
    bars: tuple[Bar, ...]
    width: int = WIDTH
    height: int = HEIGHT


def human_bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{value} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def chart(got: Series, what: str) -> Chart:
    """The bars of ``what`` (``requests`` or ``bytes``) per interval; an empty interval has
    none. Each bar's title says its interval's start (UTC) and exact figure."""
    values: list[int] = getattr(got, what)
    peak = max(values, default=0)
    slot = WIDTH / max(len(values), 1)
    bars = []
    for index, value in enumerate(values):
        if value <= 0:
            continue
        height = max(1.0, HEIGHT * value / peak)
        shown = human_bytes(value) if what == "bytes" else f"{value} requests"
        at = got.start(index).strftime("%Y-%m-%d %H:%M")
        bars.append(
            Bar(
                x=round(index * slot, 2),
                y=round(HEIGHT - height, 2),
                width=round(max(slot - 1, 1), 2),
                height=round(height, 2),
                title=f"{at}: {shown}",
            )
        )
    peak_text = human_bytes(peak) if what == "bytes" else str(peak)
    return Chart(what, peak_text, tuple(bars))
