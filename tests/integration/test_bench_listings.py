"""bench.listings runs end to end at a tiny fleet and reports every figure from the work it
claims: the fleet page's rows, a poll that sent nothing, one that sent only the changed rows,
pages of the API of the size asked for and the unpaged listing of every proxy. No timing is
asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import listings

pytestmark = pytest.mark.integration


async def test_the_benchmark_measures_what_it_names(tmp_path: Path) -> None:
    report = await listings.run(
        tmp_path, proxies=120, requests=3, changes=2, timeout=120, quiet_requests=5
    )
    f = report.figures
    assert set(f) == {
        "fleet_first",
        "poll_unchanged",
        "poll_changed",
        "fleet_filtered",
        "api_filtered_all",
        "api_filtered_none",
        "api_page_first",
        "api_page_middle",
        "api_unpaged",
    }
    assert (f["fleet_first"].status, f["fleet_first"].rows) == (200, 100)
    assert (f["poll_unchanged"].status, f["poll_unchanged"].bytes) == (204, 0)
    assert (f["poll_changed"].status, f["poll_changed"].rows) == (200, 2)
    assert f["poll_changed"].bytes < f["fleet_first"].bytes
    assert (f["fleet_filtered"].status, f["fleet_filtered"].rows) == (200, 100)
    assert (f["api_filtered_all"].rows, f["api_filtered_none"].rows) == (120, 0)
    assert f["api_page_first"].rows == 120  # one page holds the tiny fleet
    assert f["api_unpaged"].rows == 120
    assert all(fig.cpu_ms >= 0 for fig in f.values())
    assert f["poll_unchanged"].requests == 5
    assert report.idle_cpu_ms_per_s >= 0
    assert set(report.targets) == {
        "fleet_cpu_ms",
        "poll_bytes",
        "api_page_cpu_ms",
        "quiet_poll_cpu_ms",
    }
    assert all(isinstance(t["met"], bool) for t in report.targets.values())
    assert len(report.load_before) == len(report.load_after) == 3
    assert "poll_changed" in listings.render(report)
