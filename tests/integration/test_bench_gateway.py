"""bench/gateway.py runs end to end, tiny: both arms answer every request, the tunnel carries
every byte, and the report says what it measured."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from bench import gateway

pytestmark = pytest.mark.integration


async def test_a_tiny_gateway_bench_measures_both_arms(tmp_path: Path) -> None:
    args = argparse.Namespace(requests=300, concurrency=8, megabytes=4, rounds=1, connections=30)
    result = await gateway.measure(args, tmp_path)
    for arm in (*result["direct"], *result["through_gateway"]):
        assert arm["failed"] == 0, result
        assert arm["non_2xx"] == 0, result
        assert arm["requests_per_second"] > 0
    assert result["tunnel_mb_per_second"]["through_gateway"][0] > 0
    assert result["gateway_cpu_us_per_request"][0] > 0
    assert result["gateway_rss_mb"]["connections_open"] > 0
    assert set(result["met"]) == set(result["targets"])
    light = result["one_at_a_time_ms"]
    assert all(m > 0 for m in light["direct"] + light["through_gateway"]), light
    floor = result["relay_floor"]
    assert floor["requests_per_second"][0] > 0
    # CPU comes from /proc in clock ticks (10 ms): 300 requests at ~25 µs each can read as 0.
    assert floor["cpu_us_per_request"][0] >= 0
    assert floor["tunnel_mb_per_second"][0] > 0
    pinned = result["pinned"]
    if len(os.sched_getaffinity(0)) < 2:
        assert pinned is None  # one core: nothing to pin apart
        return
    assert pinned["direct"]["failed"] == pinned["through_gateway"]["failed"] == 0, pinned
    assert pinned["through_gateway"]["non_2xx"] == 0, pinned
    assert pinned["requests_per_second_ratio"] > 0
