"""The lifecycle benchmark measures what it claims: every proxy it times reached Ready, once.

Timings are never asserted here (they depend on the machine). A benchmark whose clock stopped
early, or whose system created an instance twice, would report a rate for work that was not
done as described, and that is what these tests catch, with the same code the full run uses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from bench import lifecycle
from bench.lifecycle_worker import Options

pytestmark = pytest.mark.integration

PROXIES = 20


@pytest.mark.parametrize("replicas", [1, 2])
async def test_every_proxy_ready_with_exactly_one_instance(tmp_path: Path, replicas: int) -> None:
    parsed = lifecycle.resources(PROXIES)
    assert len({r.metadata.name for r in parsed}) == PROXIES

    run = await lifecycle.run_once(tmp_path, replicas, parsed, Options(timeout=60.0))

    assert run.ready == PROXIES
    assert run.one_create == PROXIES, "one CreateInstance command per proxy"
    assert run.one_running == PROXIES, "each proxy observed Running exactly once"
    assert run.fake["created_total"] == run.fake["owners"] == PROXIES
    assert run.fake["max_live_per_owner"] == 1
    assert run.one_instance_each
    assert set(run.cpu) == {
        "executor",
        "nats-server",
        "bench",
        *(f"reconciler-{i + 1}" for i in range(replicas)),
    }


async def test_summary_pairs_replica_counts_and_reports_targets(tmp_path: Path) -> None:
    parsed = lifecycle.resources(5)
    for k in (1, 2):
        (tmp_path / f"k{k}").mkdir()
    runs = [
        await lifecycle.run_once(tmp_path / f"k{k}", k, parsed, Options(timeout=60.0))
        for k in (1, 2)
    ]

    summary = lifecycle.summarise(runs)

    assert set(summary) == {"k1", "k2", "targets"}
    assert all(summary[k]["one_instance_each"] for k in ("k1", "k2"))
    assert set(summary["targets"]) == {"seconds_k1", "seconds_k2", "ratio_k2_k1"}
    lifecycle.render(runs, summary, Console(quiet=True))


async def test_a_run_counts_the_server_s_messages_by_kind_and_profiles_it(tmp_path: Path) -> None:
    """The counts and the profile say what the server did in the timed window: every proxy's
    declaration appended once and handed to the reconciler, every command to the executor."""
    parsed = lifecycle.resources(PROXIES)
    profile = tmp_path / "server.pprof"
    options = Options(
        timeout=60.0, count_requests=True, server_profile=profile, server_profile_seconds=1
    )

    run = await lifecycle.run_once(tmp_path / "run", 1, parsed, options)

    assert run.one_instance_each
    assert run.requests["append proxy.*.declared"] == PROXIES
    assert run.requests["append proxy.*.cmd"] == PROXIES
    assert run.requests["delivery to executor"] >= PROXIES
    assert run.requests["delivery to reconciler"] >= 2 * PROXIES
    assert run.requests["ack reconciler"] >= 2 * PROXIES
    assert profile.stat().st_size > 0  # a gzipped pprof protobuf from the server itself
    assert profile.read_bytes()[:2] == b"\x1f\x8b"
