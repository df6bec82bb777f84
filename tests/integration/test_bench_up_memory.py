"""bench/up_memory.py end to end, tiny: `up` starts, a proxy goes Ready, clients lease through
it, and the report has every figure it claims."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import up_memory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def test_a_tiny_run_reports_rss_at_each_step_and_the_cycles(tmp_path: Path) -> None:
    args = argparse.Namespace(proxies=1, clients=2, seconds=3.0, sample=1.0, ready_timeout=120.0)
    doc = await up_memory.measure(args, tmp_path)
    assert doc["cycles"] > 0, doc
    rss = doc["rss_mb"]
    assert 0 < rss["started"] <= doc["peak_mb"]
    assert 0 < rss["fleet_ready"] <= doc["peak_mb"]
    assert 0 < rss["end"] <= doc["peak_mb"]
    assert doc["samples_mb"]
