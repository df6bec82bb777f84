"""The discovery benchmark measures what it claims, run tiny with the code the full run uses.

Timings are never asserted (they depend on the machine). A benchmark whose cycles failed, whose
phases did not run, or whose race check could not see a double lease would report figures for
work that was not done as described; that is what these tests catch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from bench import discovery
from bench.discovery_race import race

pytestmark = pytest.mark.integration


async def test_every_phase_runs_its_requests_without_errors(tmp_path: Path) -> None:
    rounds = await discovery.throughput(
        tmp_path, clients=4, proxies=8, seconds=0.5, rounds=2, pace=20.0
    )
    assert len(rounds) == 2
    for loads in rounds:
        assert set(loads) == set(discovery.PHASES)
        for load in loads.values():
            assert load.requests > 0, load.name
            assert not load.errors, (load.name, load.errors)
            assert set(load.cpu) == {"api", "nats-server", "bench"}
        assert len(loads["healthz"].latency_ms) == loads["healthz"].requests
        for name in ("leases", "paced"):
            # Every cycle is an acquire answered 201 and a release answered 204.
            assert loads[name].requests == 2 * loads[name].cycles == 2 * len(loads[name].latency_ms)
    summary = discovery.summarise(rounds)
    assert summary["errors"][0] == 0
    assert set(discovery.verdicts(summary)) == {"ratio", "cycle_p99"}
    discovery.render(summary, [], Console(quiet=True))


async def test_the_race_counts_grants_from_both_sides(tmp_path: Path) -> None:
    result = await race(tmp_path, replicas=2, clients=8, grants=20, seconds=60.0)
    assert result.grants >= 20
    assert sum(result.grants_by_replica) == result.grants
    assert result.doubles == 0
    assert result.log_overlaps == 0
    # The log agrees with the clients: every grant, and no claim the fold had to refuse.
    assert result.log_granted == result.grants
    assert result.log_rejected == 0
    assert result.tokens_in_order
    assert result.attempts == result.grants + result.busy
    discovery.render({}, [result], Console(quiet=True))


def test_the_percentiles_and_the_spread() -> None:
    values = [float(v) for v in range(1, 101)]
    assert discovery.pct(values, 50) == pytest.approx(50.5)
    assert discovery.pct(values, 99) == pytest.approx(99.01)
    assert discovery.pct([7.0], 99) == 7.0
    assert discovery.pct([], 99) == 0.0
    assert discovery.spread([3.0, 1.0, 2.0]) == [2.0, 1.0, 3.0]
