"""The cluster benchmark measures what it claims, run tiny with the code the full run uses.

Timings are never asserted (they depend on the machine): only that both targets did all the
work the figures are computed from, without errors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from bench import cluster

pytestmark = pytest.mark.integration


async def test_both_targets_append_every_event_and_cycle_leases(tmp_path: Path) -> None:
    options = cluster.Options(
        events=200, uids=20, concurrency=4, proxies=4, clients=2, seconds=0.5, rounds=2
    )
    rounds = await cluster.measure(tmp_path, options)
    assert len(rounds) == 2
    for figures in rounds:
        assert set(figures) == set(cluster.TARGETS)
        for f in figures.values():
            assert f.appends == options.events, f.target
            assert f.append_seconds > 0
            assert f.cycles > 0, f.target
            assert not f.errors, (f.target, f.errors)
    summary = cluster.summary(rounds)
    assert summary["cluster"]["errors"] == 0
    cluster.render(summary, Console(quiet=True))
