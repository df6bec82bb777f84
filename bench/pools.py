"""A pool of N members from 0 to all Ready, against N Proxies declared by hand, in the same run.

The issue's target: with the zero-latency fake provider, a pool's time and CPU per member within
1.1x of declaring the same Proxies by hand, and the decider's cost per evaluation flat from 100 to
10,000 members. Both arms get a fresh nats-server with the product's configuration and every
service as its own OS process (``bench.lifecycle``'s fleet: one executor, one reconciler); the
pool arm adds the pool controller, started as a deployment starts it (``run pools``). The arms
alternate which goes first each round, because the load on a shared machine drifts within a run,
and the ratios are taken per round, where both arms saw about the same load.

- **hand**: ``bench.lifecycle.run_once``, N Proxies applied at once, until all are Ready.
- **pool**: one ``PoolDeclared`` with ``replicas: N`` (``bench.pools_arm``), until all N members
  are Ready; then the controller is left at N with nothing to do, to measure its ticks.
- **decide**: ``services.pools.pure.decide.decide`` alone, no servers (``bench.pools_decide``).

Afterwards each arm is checked against the log and the fake: N proxies, each declared once, one
instance each; for the pool, N members planned once over all its decisions and none retired.

Run: ``python -m bench.pools [--members N] [--rounds R] [--pool-interval S] [--json FILE]``
(``--profile FILE``: the pool controller's cProfile stats).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import lifecycle, pools_decide
from bench.lifecycle_worker import Options, show_logs
from bench.pools_arm import PoolOptions, PoolRun, run_pool
from services.runtime.observability.logs import configure_logging

RATIO_TARGET = 1.1
ARMS = ("hand", "pool")


@dataclass(frozen=True, slots=True)
class Config:
    members: int = 1_000
    rounds: int = 2
    pool: PoolOptions = field(default_factory=PoolOptions)
    decide_sizes: tuple[int, ...] = pools_decide.SIZES
    decide_budget: float = 0.3
    timeout: float = 300.0
    log_level: str = "info"


@dataclass(frozen=True, slots=True)
class Arm:
    """One arm of one round, as the summary reads it."""

    arm: str
    round: int
    members: int
    seconds: float
    half_seconds: float
    ready: int
    cpu: dict[str, float]
    exact: bool
    load: float
    checks: dict[str, object]
    idle: dict[str, Any]

    def cpu_ms_per_member(self) -> dict[str, float]:
        per = {name: 1000 * v / self.members for name, v in self.cpu.items()}
        return {**per, "total": sum(per.values())}


def from_hand(run: lifecycle.Run, round_: int) -> Arm:
    checks = {"one_create": run.one_create, "one_running": run.one_running, "fake": run.fake}
    return Arm(
        arm="hand",
        round=round_,
        members=run.proxies,
        seconds=run.seconds,
        half_seconds=run.half_seconds,
        ready=run.ready,
        cpu={("reconciler" if k.startswith("reconciler") else k): v for k, v in run.cpu.items()},
        exact=run.one_instance_each,
        load=run.load,
        checks=checks,
        idle={},
    )


def from_pool(run: PoolRun, round_: int) -> Arm:
    cpu = {("reconciler" if k.startswith("reconciler") else k): v for k, v in run.cpu.items()}
    return Arm(
        arm="pool",
        round=round_,
        members=run.members,
        seconds=run.seconds,
        half_seconds=run.half_seconds,
        ready=run.ready,
        cpu=cpu,
        exact=bool(run.checks.get("exact")),
        load=run.load,
        checks=run.checks,
        idle=run.idle,
    )


async def one_arm(arm: str, round_: int, config: Config) -> Arm:
    options = Options(timeout=config.timeout, log_level=config.log_level)
    with tempfile.TemporaryDirectory(prefix=f"bench-pools-{arm}-") as tmp:
        try:
            if arm == "hand":
                parsed = lifecycle.resources(config.members)
                return from_hand(await lifecycle.run_once(Path(tmp), 1, parsed, options), round_)
            pool = await run_pool(Path(tmp), config.members, options, config.pool)
            return from_pool(pool, round_)
        except Exception:
            show_logs(Path(tmp))
            raise


def spread(values: list[float]) -> list[float]:
    return [statistics.median(values), min(values), max(values)]


def summarise(
    arms: list[Arm], decide: dict[str, dict[str, Any]], tick: dict[str, Any]
) -> dict[str, Any]:
    """Per arm, median (min, max) over rounds; the ratios pool/hand per round, then their
    median, which is what the targets judge."""
    out: dict[str, Any] = {}
    for name in ARMS:
        runs = [a for a in arms if a.arm == name]
        per = [a.cpu_ms_per_member() for a in runs]
        out[name] = {
            "seconds": spread([a.seconds for a in runs]),
            "half_seconds": spread([a.half_seconds for a in runs]),
            "cpu_ms_per_member": {
                k: round(statistics.median(p[k] for p in per), 3) for k in per[0]
            },
            "exact": all(a.exact for a in runs),
            "load": [round(a.load, 2) for a in runs],
        }
    idles = [a.idle for a in arms if a.idle]
    if idles:
        keys = ("pools_ms_per_tick", "pools_us_per_member_per_tick", "pools_cores")
        idle = {
            k: statistics.median(float(i[k]) for i in idles) for k in (*keys, "server_ms_per_tick")
        }
        out["idle"] = {**idle, "interval": idles[0]["interval"], "seconds": idles[0]["seconds"]}
    hands = {a.round: a for a in arms if a.arm == "hand"}
    pairs = [(hands[p.round], p) for p in arms if p.arm == "pool" and p.round in hands]
    seconds = spread([p.seconds / h.seconds for h, p in pairs])
    totals = [(h.cpu_ms_per_member()["total"], p.cpu_ms_per_member()["total"]) for h, p in pairs]
    cpu = spread([p / h for h, p in totals])
    out["ratios"] = {"seconds": seconds, "cpu_total": cpu}
    out["decide"] = decide
    out["tick"] = tick
    exact = bool(out["hand"]["exact"] and out["pool"]["exact"])
    out["targets"] = {
        "seconds_ratio": {
            "value": seconds,
            "target": RATIO_TARGET,
            "met": seconds[0] <= RATIO_TARGET,
        },
        "cpu_ratio": {"value": cpu, "target": RATIO_TARGET, "met": cpu[0] <= RATIO_TARGET},
        "decide_per_member_flat": {
            "value": {k: v["per_member_growth"] for k, v in decide.items()},
            "target": pools_decide.FLAT_TARGET,
            "met": all(bool(v["flat"]) for v in decide.values()),
        },
        "exact": {"value": exact, "target": True, "met": exact},
    }
    return out


def render(summary: dict[str, Any], members: int, console: Console) -> None:
    def cell(values: list[float], fmt: str) -> str:
        return f"{values[0]:{fmt}} ({values[1]:{fmt}}-{values[2]:{fmt}})"

    table = Table(title=f"{members} members to Ready: median (min-max) over rounds")
    names = ("executor", "reconciler", "nats-server", "pools", "bench")
    for column in ("arm", "all Ready s", "half Ready s", "CPU ms/member", *names, "exact"):
        table.add_column(column, justify="right")
    for name in ARMS:
        row = summary[name]
        cpu = row["cpu_ms_per_member"]
        table.add_row(
            name,
            cell(row["seconds"], ".2f"),
            cell(row["half_seconds"], ".2f"),
            f"{cpu['total']:.2f}",
            *(f"{cpu[n]:.2f}" if n in cpu else "-" for n in names),
            "yes" if row["exact"] else "NO",
        )
    console.print(table)
    idle = summary.get("idle")
    if idle:
        console.print(
            f"pool at {members}, nothing to do, --pool-interval {idle['interval']}: "
            f"pools {idle['pools_ms_per_tick']:.1f} ms CPU per tick "
            f"({idle['pools_us_per_member_per_tick']:.1f} µs per member, "
            f"{idle['pools_cores']:.3f} cores), nats-server {idle['server_ms_per_tick']:.1f} ms"
        )
    for kind, row in summary["decide"].items():
        sizes = ", ".join(
            f"{s['members']}: {s['us_per_evaluation']:.0f} µs ({s['us_per_member']:.2f}/member)"
            for s in row["sizes"]
        )
        console.print(f"decide, {kind} spec: {sizes}; per member x{row['per_member_growth']}")
    tick = summary["tick"]
    sizes = ", ".join(
        f"{s['members']}: {s['ms_per_tick']:.2f} ms ({s['us_per_member']:.2f} µs/member)"
        for s in tick["sizes"]
    )
    console.print(f"a steady tick in-process: {sizes}; per member x{tick['per_member_growth']}")
    for key, target in summary["targets"].items():
        value = target["value"]
        shown = cell(value, ".2f") if isinstance(value, list) else str(value)
        verdict = "met" if target["met"] else "NOT met"
        console.print(f"target {key}: {shown} vs {target['target']}: {verdict}")


async def run(config: Config, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every round of both arms, then the decider and a tick alone; what ``--json`` writes."""
    configure_logging("error")  # the bench's own connections would log their close
    arms: list[Arm] = []
    for r in range(config.rounds):
        for name in ARMS if r % 2 == 0 else tuple(reversed(ARMS)):
            arm = await one_arm(name, r, config)
            say(f"round {r + 1}, {name}: {arm.seconds:.2f} s, exact {arm.exact}")
            arms.append(arm)
    decide = pools_decide.measure(config.decide_sizes, config.decide_budget)
    tick = await pools_decide.measure_tick(config.decide_sizes, config.decide_budget)
    summary = summarise(arms, decide, tick)
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load": list(os.getloadavg()),
        },
        "config": {**asdict(config), "fsync_every_append": True},
        "summary": summary,
        "runs": [asdict(a) for a in arms],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pools", description=__doc__)
    parser.add_argument("--members", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pool-interval", type=float, default=1.0, help="run pools' own flag")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds at N to measure ticks")
    parser.add_argument("--decide-sizes", type=int, nargs="+", default=list(pools_decide.SIZES))
    parser.add_argument("--worker-log-level", default="info", help="the services' log level")
    parser.add_argument("--profile", help="cProfile stats of the (last) pool controller, here")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    profile = Path(args.profile).resolve() if args.profile else None
    config = Config(
        members=args.members,
        rounds=args.rounds,
        pool=PoolOptions(interval=args.pool_interval, idle=args.idle, profile=profile),
        decide_sizes=tuple(args.decide_sizes),
        log_level=args.worker_log_level,
    )
    doc = asyncio.run(run(config))
    render(doc["summary"], config.members, Console())
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
