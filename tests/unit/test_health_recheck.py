"""When failed reports call for a recheck: multiples of N only, forward only, off at 0; and the
option that sets N."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from events.schemas import LeaseAcquired, LeaseReported
from events.store import Recorded
from projections.lease import LeaseView, apply
from projections.outcomes import Reports
from services.cli.flags import options
from services.cli.main import main
from services.health.metrics import HealthMetrics
from services.health.pure.recheck import (
    MAX_FAILED_REPORTS_RECHECK,
    check_every,
    crossed,
    failed_streak,
    recheck_due,
)
from services.health.scheduler import Prober, _Slot
from services.health.service import HealthService, HealthSettings, build
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import build_settings

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def view(streak: int, seq: int) -> LeaseView:
    return LeaseView(proxy_uid="p1", reports=Reports(failed_streak=streak), last_seq=seq)


def recorded(seq: int, event: LeaseAcquired | LeaseReported) -> Recorded:
    return Recorded(seq=seq, subject="lease.p1", timestamp=T0 + timedelta(seconds=seq), event=event)


def report(outcome: str) -> LeaseReported:
    return LeaseReported(lease_id="l1", proxy_uid="p1", outcome=outcome)


def rechecks(outcomes: list[str], every: int) -> list[int]:
    """Fold a lease and these reports as the service does; the sequences that call for one."""
    folded = apply(None, recorded(1, LeaseAcquired(lease_id="l1", proxy_uid="p1", ttl_seconds=60)))
    due = []
    for seq, outcome in enumerate(outcomes, start=2):
        after = apply(folded, recorded(seq, report(outcome)))
        if recheck_due(folded, after, every):
            due.append(seq)
        folded = after
    return due


def test_the_nth_consecutive_failed_report_calls_for_a_recheck_and_each_further_multiple() -> None:
    assert rechecks(["failed"] * 2, 3) == []
    assert rechecks(["failed"] * 3, 3) == [4]
    assert rechecks(["failed"] * 10, 3) == [4, 7, 10]
    assert rechecks(["failed"] * 3, 1) == [2, 3, 4]


def test_a_success_or_blocked_report_starts_the_count_again() -> None:
    assert rechecks(["failed", "failed", "success", "failed", "failed"], 3) == []
    assert rechecks(["failed", "failed", "blocked", "failed", "failed", "failed"], 3) == [7]


def test_zero_turns_it_off() -> None:
    assert rechecks(["failed"] * 10, 0) == []
    assert not recheck_due(view(0, 1), view(1, 2), 0)
    assert not recheck_due(None, view(5, 1), -3)


def test_the_first_event_of_a_proxy_counts_from_nothing() -> None:
    assert recheck_due(None, view(1, 1), 1)
    assert not recheck_due(None, view(1, 1), 3)


def test_a_view_that_does_not_move_forward_never_calls_for_one() -> None:
    """A replay, or a view rebuilt from an earlier point, is history: no probe for it."""
    assert not recheck_due(view(2, 10), view(3, 10), 3)  # the same event again
    assert not recheck_due(view(2, 10), view(3, 9), 3)  # a view going backwards
    assert not recheck_due(view(6, 10), view(3, 11), 3)  # a streak going down
    assert not recheck_due(view(3, 10), view(3, 11), 3)  # reached already


def test_hostile_streaks() -> None:
    assert failed_streak(view(-5, 1)) == 0
    assert failed_streak(None) == 0
    assert not recheck_due(view(-7, 1), view(-1, 2), 3)
    assert recheck_due(view(-7, 1), view(3, 2), 3)  # a negative start counts as none
    huge = 10**30
    assert recheck_due(view(huge - 1, 1), view(huge, 2), 10)
    assert not recheck_due(view(huge, 1), view(huge + 1, 2), 10)
    # A jump over several multiples (no fold makes one) is one recheck, not several.
    assert recheck_due(view(0, 1), view(huge, 2), 3)


@given(
    before=st.integers(min_value=-3000, max_value=3000),
    after=st.integers(min_value=-3000, max_value=3000),
    every=st.integers(min_value=-5, max_value=MAX_FAILED_REPORTS_RECHECK),
)
def test_crossed_is_whether_the_growth_reached_a_new_multiple(
    before: int, after: int, every: int
) -> None:
    grown = range(max(0, before) + 1, max(0, after) + 1)
    expected = every > 0 and any(n % every == 0 for n in grown)
    assert crossed(before, after, every) is expected


def test_crossing_one_at_a_time_calls_for_exactly_the_multiples() -> None:
    for every in (1, 2, 3, 7):
        due = [n for n in range(1, 50) if crossed(n - 1, n, every)]
        assert due == list(range(every, 50, every))


@pytest.mark.parametrize("bad", [-1, MAX_FAILED_REPORTS_RECHECK + 1, 2.5, True, "3"])
def test_a_count_out_of_bounds_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=r"whole number|between 0"):
        check_every(bad)


def test_build_names_the_flag_and_the_service_refuses_a_bad_count() -> None:
    settings = Settings(nats_url="nats://127.0.0.1:4222")
    url = "http://127.0.0.1:9/"
    with pytest.raises(ConfigError, match=r"^--failed-reports-recheck / HEALTH_FAILED_REPORTS"):
        build_settings(HealthSettings, {"check_url": url, "failed_reports_recheck": -1})
    with pytest.raises(ConfigError, match=r"^--failed-reports-recheck / HEALTH_FAILED_REPORTS"):
        build(settings, HealthSettings(check_url=url, failed_reports_recheck=-1))
    assert build(settings, HealthSettings(check_url=url)).failed_reports_recheck == 3
    zero = HealthSettings(check_url=url, failed_reports_recheck=0)
    assert build(settings, zero).failed_reports_recheck == 0
    with pytest.raises(ValueError, match="between 0"):
        HealthService(failed_reports_recheck=MAX_FAILED_REPORTS_RECHECK + 1)


def test_the_option_is_bounded_and_read_from_its_variable() -> None:
    (option,) = [o for o in options(HealthSettings) if o.name == "failed_reports_recheck"]
    assert option.envvar == "HEALTH_FAILED_REPORTS_RECHECK"
    assert option.default == 3
    runner = CliRunner()
    for value in ("-1", "1001", "many"):
        result = runner.invoke(main, ["run", "health", "--failed-reports-recheck", value])
        assert result.exit_code == 2, result.output
        assert "--failed-reports-recheck" in result.output


async def test_a_recheck_wakes_the_probe_task_once_and_a_probe_in_flight_counts() -> None:
    """The prober's step, without a network: a slot we probe is woken; a second recheck while
    the wake is pending, or while a probe runs, adds nothing; a proxy we do not own is left to
    its owner."""

    class _Client:
        async def close(self) -> None:
            return None

        def forget(self, url: str) -> None:
            del url

    registry = CollectorRegistry()
    prober = Prober(
        store=None,  # type: ignore[arg-type]
        projector=None,  # type: ignore[arg-type]
        client=_Client(),  # type: ignore[arg-type]
        metrics=HealthMetrics(registry),
        default_check_url="http://127.0.0.1:9/",
    )

    async def idle() -> None:
        await asyncio.Event().wait()

    slot = _Slot(task=asyncio.create_task(idle()))
    prober._slots["p1"] = slot
    try:
        assert prober.recheck("p1", 3, lambda uid: True) == "woken"
        assert slot.wake.is_set()
        assert prober.recheck("p1", 3, lambda uid: True) == "in_flight"
        slot.wake.clear()
        slot.probing = True
        assert prober.recheck("p1", 6, lambda uid: True) == "in_flight"
        assert not slot.wake.is_set()
        assert prober.recheck("p1", 9, lambda uid: False) is None
        assert prober.recheck("other", 3, lambda uid: True) is None
        assert prober.rechecks == {"p1": 1}

        def counted(result: str) -> float | None:
            return registry.get_sample_value("egress_health_rechecks_total", {"result": result})

        assert counted("woken") == 1
        assert counted("in_flight") == 2
    finally:
        await prober.close()


async def test_a_woken_slot_ends_its_sleep_at_once() -> None:
    slot = _Slot()
    slot.wake.set()
    assert await Prober._sleep(slot, 3600.0) is True
    assert not slot.wake.is_set()
    assert await Prober._sleep(slot, 0.0) is False
