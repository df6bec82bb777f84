"""The scale benchmark runs end to end at tiny sizes and reports every figure it promises.

Timings are never asserted (they depend on the machine). What is checked is that each figure
comes from the work it claims: the "after" start-ups restored a snapshot pass and the "before"
ones did not, the reconciler without states read whole histories and the default one only their
tails, every service caught up without appending anything, and the lifecycle made exactly one
instance per proxy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from bench import scale

pytestmark = pytest.mark.integration

TINY = scale.Config(
    startup_sizes=(200, 1_000),
    startup_proxies=20,
    starts=1,
    writer_interval=1.0,
    history=(10, 100),
    reconciles=4,
    rss_proxies=30,
    health_interval=1.0,
    idle_window=0.5,
    read_sizes=(600, 1_200),
    reads=20,
    read_rounds=1,
    lifecycle_sizes=(10, 20),
    lifecycle_rounds=1,
    timeout=180.0,
)


def has_target(targets: dict[str, dict[str, object]], key: str) -> None:
    assert key in targets, targets
    assert isinstance(targets[key]["met"], bool)
    assert "target" in targets[key]


async def test_every_section_reports_its_figures(tmp_path: Path) -> None:
    results = await scale.run(tmp_path, TINY, say=lambda _: None)
    sections = results.sections
    assert set(sections) == set(scale.SECTIONS)
    for section in sections.values():
        assert len(section["load_before"]) == len(section["load_after"]) == 3

    startup = sections["startup"]["summary"]
    assert [row["lease_events"] for row in startup["sizes"]] == [200, 1_000]
    for row in startup["sizes"]:
        assert row["before_s"] > 0
        assert row["after_s"] > 0
        assert 0 < row["after_in_service_s"] < row["after_s"]  # the imports come first
        assert row["before_restored_views"] == 0  # no snapshots: folded from sequence 1
        assert row["after_restored_views"] > TINY.startup_proxies  # proxy and lease views
        assert row["after_rss_mb"] > 0
        assert len(row["loads"]) == 2 * TINY.starts
    assert startup["empty_s"] > 0
    assert startup["empty_in_service_s"] > 0
    assert startup["growth_before"] is not None
    assert startup["growth_after"] is not None
    has_target(startup["targets"], "after_seconds")
    has_target(startup["targets"], "after_growth")

    reconcile = sections["reconcile"]["summary"]
    cases = {(c["history"], c["mode"]): c for c in reconcile["cases"]}
    assert set(cases) == {(h, m) for h in TINY.history for m in ("before", "after")}
    for (history, mode), case in cases.items():
        assert case["reconciles"] == TINY.reconciles
        assert set(case["outcomes"]) <= {"ready", "unhealthy"}  # each step appended a status
        if mode == "before":
            assert case["events_read"] > history  # the whole history, every time
        else:
            assert case["events_read"] <= 2  # the new verdict (and its own last status)
        assert case["p50_ms"] > 0
        assert len(case["load"]) == 2
    assert reconcile["growth_before"] is not None
    assert reconcile["growth_after"] is not None
    has_target(reconcile["targets"], "after_growth")

    rss = sections["rss"]["summary"]
    assert set(rss["services"]) == {"discovery", "reconciler", "executor", "gc", "health"}
    for name, row in rss["services"].items():
        assert row["rss_mb"] > 0, name
        assert row["peak_mb"] >= row["rss_mb"], name
        if name != "health":  # a probe slowed by the machine may record a latency change
            assert row["appended"] == 0, name  # the fleet was settled: nobody had work to do
        assert row["load"] >= 0
    assert "watcher" in rss["skipped"]
    has_target(rss["targets"], "rss_mb")

    reads = sections["reads"]
    if "skipped" not in reads:
        summary = reads["summary"]
        assert [row["size"] for row in summary["sizes"]] == list(TINY.read_sizes)
        for row in summary["sizes"]:
            assert row["readers"], row
            assert all(figures["wrong"] == 0 for figures in row["readers"].values())
            assert len(row["load"]) == 2
        has_target(summary["targets"], "store_growth")

    lifecycle = sections["lifecycle"]["summary"]
    assert set(lifecycle["sizes"]) == {"10", "20"}
    for row in lifecycle["sizes"].values():
        assert row["one_instance_each"]
        assert row["cpu_ms_per_proxy"] >= row["system_cpu_ms_per_proxy"] > 0  # less the bench
        assert 0 < row["busiest_service_cpu_ms_per_proxy"] <= row["system_cpu_ms_per_proxy"]
        assert row["cores_used"] > 0
    has_target(lifecycle["targets"], "proposed_system_proxies_per_cpu_second")
    has_target(lifecycle["targets"], "proposed_busiest_service_cpu_ms_per_proxy")
    assert lifecycle["targets"]["all_ready_seconds"]["measured_at_target_size"] is False
    has_target(lifecycle["targets"], "cpu_per_proxy_growth")
    assert all(run["load"] >= 0 for run in sections["lifecycle"]["runs"])

    scale.render(results, Console(quiet=True))
    json.dumps(results.as_json(), default=str)


def test_the_memory_section_can_measure_some_services_only() -> None:
    config, _ = scale.parse(["--only", "rss", "--rss-services", "health,gc"])
    assert config.rss_services == ("health", "gc")
    assert scale.parse([])[0].rss_services == (
        "discovery",
        "reconciler",
        "executor",
        "gc",
        "health",
    )
    with pytest.raises(SystemExit):
        scale.parse(["--rss-services", "watcher"])  # not measured: no Kubernetes API server
