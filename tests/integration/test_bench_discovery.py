"""The discovery benchmark measures what it claims, run tiny with the code the full run uses.

Timings are never asserted (they depend on the machine). A benchmark whose cycles failed, whose
phases did not run, or whose race check could not see a double lease would report figures for
work that was not done as described; that is what these tests catch.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from bench import discovery
from bench import discovery_report as report
from bench.discovery_race import race
from events import codec, subjects
from events.schemas import LeaseAcquired
from services.runtime.eventlog.streams import differences, ensure_streams
from services.runtime.nats.connection import connect
from services.runtime.nats.server import EmbeddedNatsServer

pytestmark = pytest.mark.integration


async def test_every_phase_runs_its_requests_without_errors(tmp_path: Path) -> None:
    info: dict[str, object] = {}
    rounds = await discovery.throughput(
        tmp_path, clients=4, proxies=8, seconds=0.5, rounds=2, info=info
    )
    assert info == {"api_loop": "uvloop", "api_http": "httptools"}
    assert len(rounds) == 2
    for r, loads in enumerate(rounds):
        assert set(loads) == set(discovery.PHASES)
        # Raw and leases swap order each round; paced always comes after leases.
        names = list(loads)
        assert names.index("paced") > names.index("leases")
        assert (names.index("raw") < names.index("leases")) == (r % 2 == 0)
        for load in loads.values():
            assert load.requests > 0, load.name
            assert not load.errors, (load.name, load.errors)
            assert set(load.cpu) == {"api", "nats-server", "bench"}
        for name in ("healthz", "raw"):
            # One latency per answered request (healthz) or acknowledged append (raw).
            assert len(loads[name].latency_ms) == loads[name].requests
        for name in ("leases", "paced"):
            # Every cycle is an acquire answered 201 and a release answered 204.
            assert loads[name].requests == 2 * loads[name].cycles == 2 * len(loads[name].latency_ms)
        # The paced phase asked for half the rate the saturated phase of its round measured.
        assert loads["paced"].pace == pytest.approx(max(1.0, loads["leases"].cycle_rate / 2))
        # The ratio is computed from this round's measured numbers: a cycle is two appends.
        cycles = loads["leases"].cycles / loads["leases"].seconds
        appends = loads["raw"].requests / loads["raw"].seconds
        assert report.ratio(loads) == pytest.approx(cycles / (appends / 2))
    summary = report.summarise(rounds)
    assert summary["errors"][0] == 0
    ratios = sorted(report.ratio(loads) for loads in rounds)
    assert summary["ratio cycles/(raw/2)"] == pytest.approx([sum(ratios) / 2, *ratios])
    assert summary["paced cycle p99 ms"][0] > 0
    assert summary["healthz req/s (info)"][0] > 0
    assert set(report.verdicts(summary)) == {
        "ratio",
        "paced_p99",
        "proposed_paced_p99",
        "proposed_api_cpu",
    }
    report.render(summary, [], Console(quiet=True))


async def test_the_raw_appends_land_in_a_stream_configured_like_lease(tmp_path: Path) -> None:
    """The raw side writes what the API writes, where the API's view cannot see it, on a stream
    that differs from ``LEASE`` in its name and subjects only."""
    rounds = await discovery.throughput(
        tmp_path, clients=2, proxies=4, seconds=0.3, rounds=1, phases=("raw",)
    )
    assert set(rounds[0]) == {"raw"}
    assert set(report.summarise(rounds)) >= {"raw appends/s", "errors"}
    assert report.verdicts(report.summarise(rounds)) == {}
    server = EmbeddedNatsServer(tmp_path / "again")
    await server.start()
    conn = await connect(server.url, name="test")
    try:
        await ensure_streams(conn.js)
        await discovery.ensure_raw_stream(conn.js)
        lease = (await conn.js.stream_info(subjects.LEASE_STREAM)).config
        raw = (await conn.js.stream_info(discovery.RAW_STREAM)).config
        assert not differences(raw, replace(lease, subjects=[f"{discovery.RAW_SUBJECT}.*"]))
        assert raw.name != lease.name
        payload = discovery.lease_payload()
        event = codec.decode(payload.payload, payload.headers)
        assert isinstance(event, LeaseAcquired)
        assert payload.headers[codec.HDR_EVENT_TYPE] == "LeaseAcquired"
    finally:
        await conn.close()
        await server.stop()


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
    report.render({}, [result], Console(quiet=True))


def test_the_percentiles_and_the_spread() -> None:
    values = [float(v) for v in range(1, 101)]
    assert report.pct(values, 50) == pytest.approx(50.5)
    assert report.pct(values, 99) == pytest.approx(99.01)
    assert report.pct([7.0], 99) == 7.0
    assert report.pct([], 99) == 0.0
    assert report.spread([3.0, 1.0, 2.0]) == [2.0, 1.0, 3.0]
