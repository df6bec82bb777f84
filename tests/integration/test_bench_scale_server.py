"""The server-at-scale benchmark measures what it claims: each store holds the fleet asked for,
the server and discovery were read once settled, the lease cycles succeeded and were counted
against the API's own CPU, and after the SIGKILL a new server answered on the same store, with
every event still there, and discovery leased again through it.

Timings are never asserted (they depend on the machine), only the work behind them and that
each figure is a measurement (positive where the process did work).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from bench import scale_server
from bench.scale_fleet import LIFECYCLE_EVENTS
from events import subjects

pytestmark = pytest.mark.integration


async def test_a_tiny_run_measures_each_size_and_survives_the_kill(tmp_path: Path) -> None:
    config = scale_server.Config(
        sizes=(20, 60), clients=4, lease_seconds=0.5, lease_rounds=1, restart_sizes=(60,)
    )
    sizes = await scale_server.measure(tmp_path, config, say=lambda _: None)

    assert [s.proxies for s in sizes] == [20, 60]
    for size in sizes:
        assert size.fill.events == size.proxies * LIFECYCLE_EVENTS
        proxy = size.streams[subjects.PROXY_STREAM]
        assert proxy["messages"] == size.proxies * LIFECYCLE_EVENTS
        assert proxy["bytes"] > 0
        assert size.disk_bytes >= proxy["bytes"]
        assert size.server is not None
        assert size.server.rss_mb > 0
        assert size.discovery is not None
        assert size.discovery.rss_mb > 0
        assert size.discovery.cpu_s > 0
        assert size.discovery_caught_up_s > 0

        assert len(size.cycles) == 1
        for cycles in size.cycles:
            assert cycles.cycles > 0
            assert cycles.errors == {}
            assert cycles.api_us > 0

        restart = size.restart
        if size.proxies == 20:
            assert restart is None  # not one of the sizes asked to restart
            continue
        assert restart is not None
        assert 0 < restart.jetstream_s <= restart.discovery_healthz_s
        assert restart.discovery_healthz_s <= restart.discovery_cycle_s
        assert restart.before.rss_mb > 0
        assert restart.after.rss_mb > 0
        assert restart.after.cpu_s >= restart.jetstream_cpu_s

    doc = scale_server.report(sizes, config)
    summary = doc["summary"]
    assert isinstance(summary, list)
    assert [row["proxies"] for row in summary] == [20, 60]
    assert all(row["cycle_errors"] == 0 for row in summary)
    assert float(str(doc["cycle_api_growth"])) > 0
    json.dumps(doc)  # what --json writes

    console = Console(record=True, width=300)
    scale_server.render(sizes, console)
    text = console.export_text()
    assert "60" in text
    assert "kill -9" in text
