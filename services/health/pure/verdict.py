"""The health verdict: probe results in, ``HealthChanged`` decisions out. Pure: no I/O, no clock.

Why counters live in memory but the verdict does not: the *recorded* verdict (``Known``) is read
from the event log, so a replica that takes a proxy over continues from what was recorded and
repeats nothing; only the consecutive-result streak is local, and starting it afresh on takeover
costs at most a threshold's worth of probes before the next transition.

Why an event only on a change: the log keeps facts. A verdict is recorded the first time one is
reached (``successThreshold`` consecutive successes or ``failureThreshold`` consecutive failures
from unknown), when a threshold is crossed, and when the smoothed latency of a healthy proxy
moves by more than the band from the latency last recorded. Everything else goes to metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

PROBE_SUCCEEDED = "ProbeSucceeded"
PROBE_FAILED = "ProbeFailed"
LATENCY_CHANGED = "LatencyChanged"

SMOOTHING = 0.3
"""Weight of the newest latency sample in the moving average: one slow probe moves the average
by less than a third of the jump, so a single outlier is not an event."""


@dataclass(frozen=True, slots=True)
class Known:
    """The verdict the log holds for the current instance (``healthy`` None: none yet)."""

    healthy: bool | None = None
    latency_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Thresholds:
    failure_threshold: int = 3
    success_threshold: int = 1
    latency_band_ms: float = 0.0
    """0 turns latency events off."""


@dataclass(frozen=True, slots=True)
class Streak:
    """Consecutive results and the smoothed latency of successful probes, since this replica
    started probing the instance."""

    successes: int = 0
    failures: int = 0
    latency_ms: float = 0.0
    samples: int = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    latency_ms: float = 0.0
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Verdict:
    healthy: bool
    reason: str
    message: str
    latency_ms: float


def observe(streak: Streak, outcome: Outcome) -> Streak:
    if not outcome.ok:
        return replace(streak, successes=0, failures=streak.failures + 1)
    latency = (
        outcome.latency_ms
        if streak.samples == 0
        else streak.latency_ms + SMOOTHING * (outcome.latency_ms - streak.latency_ms)
    )
    return Streak(
        successes=streak.successes + 1,
        failures=0,
        latency_ms=latency,
        samples=streak.samples + 1,
    )


def judge(
    known: Known, streak: Streak, outcome: Outcome, thresholds: Thresholds
) -> tuple[Streak, Verdict | None]:
    """Fold one probe into the streak and say what, if anything, to record."""
    streak = observe(streak, outcome)
    first = known.healthy is None
    latency = round(streak.latency_ms, 1)
    if known.healthy is not True and streak.successes >= thresholds.success_threshold:
        how = "first verdict" if first else "recovered"
        return streak, Verdict(
            True,
            PROBE_SUCCEEDED,
            f"{how}: {streak.successes} consecutive probe(s) succeeded",
            latency,
        )
    if known.healthy is not False and streak.failures >= thresholds.failure_threshold:
        how = "first verdict" if first else "failed"
        return streak, Verdict(
            False,
            PROBE_FAILED,
            f"{how}: {streak.failures} consecutive probe(s) failed; last: {outcome.detail}",
            0.0,
        )
    if (
        known.healthy is True
        and outcome.ok
        and thresholds.latency_band_ms > 0
        and abs(streak.latency_ms - known.latency_ms) > thresholds.latency_band_ms
    ):
        return streak, Verdict(
            True,
            LATENCY_CHANGED,
            f"latency {known.latency_ms:.0f} ms -> {streak.latency_ms:.0f} ms",
            latency,
        )
    return streak, None
