"""The health verdict: thresholds, first verdicts, transitions only, latency band."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from services.health.pure.verdict import (
    LATENCY_CHANGED,
    PROBE_FAILED,
    PROBE_SUCCEEDED,
    Known,
    Outcome,
    Streak,
    Thresholds,
    Verdict,
    judge,
)

OK = Outcome(True, 10.0)
FAIL = Outcome(False, 0.0, "connection refused")
THREE_TWO = Thresholds(failure_threshold=3, success_threshold=2)


def run(
    outcomes: list[Outcome], thresholds: Thresholds, known: Known | None = None
) -> list[tuple[int, Verdict]]:
    """Feed outcomes as the service does: a recorded verdict becomes the known state."""
    known = known or Known()
    streak = Streak()
    verdicts = []
    for i, outcome in enumerate(outcomes):
        streak, verdict = judge(known, streak, outcome, thresholds)
        if verdict is not None:
            verdicts.append((i, verdict))
            known = Known(verdict.healthy, verdict.latency_ms)
    return verdicts


def test_first_verdict_healthy_after_success_threshold() -> None:
    assert [(i, v.healthy, v.reason) for i, v in run([OK, OK, OK], THREE_TWO)] == [
        (1, True, PROBE_SUCCEEDED)
    ]


def test_first_verdict_unhealthy_only_after_failure_threshold() -> None:
    verdicts = run([FAIL, FAIL, FAIL, FAIL], THREE_TWO)
    assert [(i, v.healthy, v.reason) for i, v in verdicts] == [(2, False, PROBE_FAILED)]
    assert "first verdict" in verdicts[0][1].message
    assert "connection refused" in verdicts[0][1].message


def test_a_success_resets_the_failure_streak() -> None:
    outcomes = [OK, OK, FAIL, FAIL, OK, FAIL, FAIL, FAIL]
    verdicts = run(outcomes, THREE_TWO)
    assert [(i, v.healthy) for i, v in verdicts] == [(1, True), (7, False)]


def test_recovery_needs_success_threshold_in_a_row() -> None:
    outcomes = [OK, FAIL, OK, FAIL, OK, OK]
    verdicts = run(outcomes, THREE_TWO, Known(False))
    assert [(i, v.healthy, v.message.split(":")[0]) for i, v in verdicts] == [
        (5, True, "recovered")
    ]


def test_steady_state_records_nothing() -> None:
    assert run([OK] * 500, THREE_TWO, Known(True, 10.0)) == []
    assert run([FAIL] * 500, THREE_TWO, Known(False)) == []


def test_material_latency_change_is_recorded_once() -> None:
    band = replace(THREE_TWO, latency_band_ms=50.0)
    slow = [Outcome(True, 300.0)] * 30
    verdicts = run(slow, band, Known(True, 10.0))
    assert [v.reason for _, v in verdicts] == [LATENCY_CHANGED]
    assert verdicts[0][1].healthy is True
    assert 60.0 < verdicts[0][1].latency_ms <= 300.0


def test_jitter_inside_the_band_and_a_single_outlier_record_nothing() -> None:
    band = replace(THREE_TWO, latency_band_ms=50.0)
    jitter = [Outcome(True, 10.0 + (i % 5) * 10) for i in range(100)]
    assert run(jitter, band, Known(True, 20.0)) == []
    assert run([*[OK] * 5, Outcome(True, 150.0), *[OK] * 5], band, Known(True, 10.0)) == []


def test_band_zero_turns_latency_events_off() -> None:
    assert run([Outcome(True, 900.0)] * 20, THREE_TWO, Known(True, 10.0)) == []


@given(
    st.lists(st.booleans(), max_size=200),
    st.integers(1, 5),
    st.integers(1, 5),
)
def test_verdicts_alternate_and_follow_the_thresholds(
    results: list[bool], failures: int, successes: int
) -> None:
    outcomes = [OK if ok else FAIL for ok in results]
    verdicts = run(outcomes, Thresholds(failure_threshold=failures, success_threshold=successes))
    states = [v.healthy for _, v in verdicts]
    assert all(a != b for a, b in itertools.pairwise(states))
    for i, verdict in verdicts:
        need = successes if verdict.healthy else failures
        window = results[i - need + 1 : i + 1]
        assert len(window) == need
        assert all(ok == verdict.healthy for ok in window)
