"""The pools benchmark measures what it claims: both arms made every member Ready, once.

Timings are never asserted (they depend on the machine). A pool arm whose clock stopped early,
whose controller planned a member twice, or whose system made an instance twice would report a
time per member for work that was not done as described; that is what these tests catch, with
the code the full run uses. 120 members take two decisions (at most 100 each), so "planned once"
is checked across decisions.
"""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from bench import pools
from bench.pools_arm import PoolOptions, exact

pytestmark = pytest.mark.integration

MEMBERS = 120
TINY = pools.Config(
    members=MEMBERS,
    rounds=1,
    pool=PoolOptions(interval=0.1, idle=1.0, settle=0.2),
    decide_sizes=(10, 100),
    decide_budget=0.01,
    timeout=120.0,
)


async def test_both_arms_ready_once_each_and_every_figure_reported() -> None:
    doc = await pools.run(TINY, say=lambda _: None)

    runs = {run["arm"]: run for run in doc["runs"]}
    assert set(runs) == {"hand", "pool"}
    for run in runs.values():
        assert run["ready"] == MEMBERS
        assert run["exact"], run["checks"]
        assert run["seconds"] > 0
    checks = runs["pool"]["checks"]
    assert checks["decisions"] == 2
    assert checks["reasons"] == ["ScaleUp"]
    assert checks["planned"] == checks["planned_distinct"] == checks["active"] == MEMBERS
    assert checks["declared_once"] == checks["one_create"] == checks["one_running"] == MEMBERS
    assert checks["fake"]["created_total"] == MEMBERS
    assert checks["fake"]["max_live_per_owner"] == 1

    summary = doc["summary"]
    hand, pool = summary["hand"]["cpu_ms_per_member"], summary["pool"]["cpu_ms_per_member"]
    assert set(hand) == {"executor", "reconciler", "nats-server", "bench", "total"}
    assert set(pool) == set(hand) | {"pools"}
    assert pool["pools"] > 0
    assert pool["total"] == pytest.approx(sum(v for k, v in pool.items() if k != "total"), abs=0.01)
    assert summary["idle"]["interval"] == TINY.pool.interval
    assert summary["idle"]["pools_ms_per_tick"] >= 0
    assert len(summary["ratios"]["seconds"]) == len(summary["ratios"]["cpu_total"]) == 3
    for kind in ("plain", "recycling"):
        rows = summary["decide"][kind]["sizes"]
        assert [row["members"] for row in rows] == [10, 100]
        assert all(row["us_per_member"] > 0 for row in rows)
    assert [row["members"] for row in summary["tick"]["sizes"]] == [10, 100]
    targets = summary["targets"]
    assert set(targets) == {"seconds_ratio", "cpu_ratio", "decide_per_member_flat", "exact"}
    assert all(isinstance(t["met"], bool) for t in targets.values())
    assert targets["exact"]["met"] is True

    pools.render(summary, MEMBERS, Console(quiet=True))
    json.dumps(doc)


def test_a_member_planned_twice_or_an_instance_made_twice_is_not_exact() -> None:
    count = 3
    checks: dict[str, object] = {
        "planned": count,
        "planned_distinct": count,
        "active": count,
        "proxies": count,
        "declared_once": count,
        "one_create": count,
        "one_running": count,
        "retired": 0,
        "unusable": 0,
        "proxies_are_members": True,
    }
    fake: dict[str, object] = {"created_total": count, "owners": count, "max_live_per_owner": 1}
    assert exact(checks, fake, count)
    assert not exact({**checks, "planned": count + 1}, fake, count)
    assert not exact({**checks, "declared_once": count - 1}, fake, count)
    assert not exact(checks, {**fake, "max_live_per_owner": 2}, count)
    assert not exact({**checks, "proxies_are_members": False}, fake, count)
