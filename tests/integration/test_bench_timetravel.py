"""The time-travel benchmark measures what it claims: the store holds the proxies and LEASE events
asked for, the writer folded every event and wrote a checkpoint at every boundary, every travel
folded from one (or from the first event before the first) and read only what came after it, and
the replays it compares with gave the same views.

Timings are never asserted (they depend on the machine), only the work behind them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import timetravel
from bench.scale_fleet import LIFECYCLE_EVENTS

pytestmark = pytest.mark.integration


async def test_a_tiny_run_does_the_work_it_reports(tmp_path: Path) -> None:
    config = timetravel.Config(
        proxies=30, lease_events=3000, every=500, instants=6, replays=3, seed=3
    )
    report = await timetravel.measure(config, tmp_path, say=lambda _: None)

    assert report.fill["proxies"]["events"] == 30 * LIFECYCLE_EVENTS
    assert report.fill["leases"]["events"] == 3000
    written = {w.stream: w for w in report.written}
    assert written["LEASE"].folded == 3000
    assert written["LEASE"].written == 3000 // 500
    assert written["LEASE"].stored_bytes > 0
    assert 1 <= written["LEASE"].fulls <= written["LEASE"].written
    assert written["PROXY"].folded == 30 * LIFECYCLE_EVENTS
    assert written["PROXY"].written == 30 * LIFECYCLE_EVENTS // 500
    assert written["POOL"].folded == 0

    assert len(report.instants) == 6
    for instant in report.instants:
        lease = instant.checkpoints["LEASE"]
        assert lease % 500 == 0
        # The proxies' events first, then up to ``every`` lease events after the checkpoint,
        # and the one that ended each read.
        assert instant.read <= 30 * LIFECYCLE_EVENTS + 500 + 3
    assert any(i.checkpoints["LEASE"] > 0 for i in report.instants)
    replayed = [i for i in report.instants if i.replay_cpu is not None]
    assert len(replayed) == 3
    assert all(i.same_as_replay for i in replayed)
    summary = report.summary()
    assert summary["all_same_as_replay"] is True
    assert summary["checkpoints"]["LEASE"] == 6
    assert summary["lease_bytes_ratio"] == round(
        written["LEASE"].stored_bytes / written["LEASE"].stream_bytes, 3
    )
