"""Costs that stay flat as the fleet and its history grow: every figure of the issue, in one run,
each with today's figure beside it from the same run on the same data.

1. **Discovery start-up** (``bench.scale_startup``): a replica's process start to ``/healthz``
   200 with ``--startup-proxies`` proxies and each of ``--startup-sizes`` lease events, without
   snapshots (before) and restoring a replica's snapshot pass (after). Targets: ≤ 3 s at every
   size, the largest size ≤ 1.5 times the smallest.
2. **Decide-and-append** (``bench.scale_reconcile``): ``Reconciler.reconcile`` on a proxy with
   each of ``--history`` events, with no kept state (before) and the default states (after).
   Target: the longest history's p50 ≤ 1.5 times the shortest's.
3. **Resident memory** (``bench.scale_rss``): every service as its own process, with
   ``--rss-proxies`` proxies in its views. Target: ≤ 150 MB each.
4. **Aggregate reads** (``bench.scale_reads``): one proxy's read in streams of each of
   ``--read-sizes`` messages, the wildcard read as it was and the store's as it is.
5. **Lifecycle** (``bench.lifecycle``): ``--lifecycle-sizes`` proxies declared at once to all
   Ready, one reconciler. Targets: all Ready ≤ 25 s at 10,000; CPU per proxy growing ≤ 1.3 times
   from the smallest size to the largest. Proposed instead of the 25 s, which measures the
   machine's free cores more than the system (docs/benchmarks.md): ≥ 80 proxies per CPU-second
   of the server, reconciler and executor at 10,000, and ≤ 2.5 ms of CPU per proxy in the
   busiest single-process service.

Every figure is stored with the 1-minute load average when it was taken: on a shared machine
wall times move with the load, CPU time much less.

Run: ``python -m bench.scale [--only startup,reconcile,rss,reads,lifecycle] [--json FILE]``; the
sizes are flags (``--help``). At the defaults a run took about 20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import scale_reconcile, scale_rss, scale_startup
from bench.scale_fleet import load
from services.runtime.observability.logs import configure_logging

SECTIONS = ("startup", "reconcile", "rss", "reads", "lifecycle")
LIFECYCLE_SECONDS_TARGET = 25.0
LIFECYCLE_SECONDS_AT = 10_000
LIFECYCLE_CPU_GROWTH_TARGET = 1.3
SYSTEM_RATE_TARGET = 80.0
"""Proposed (docs/benchmarks.md): proxies per CPU-second of the server, reconciler and executor."""
PROCESS_CPU_MS_TARGET = 2.5
"""Proposed: CPU ms per proxy of each single-process service, so one keeps up with 400/s."""


@dataclass(frozen=True, slots=True)
class Config:
    sections: tuple[str, ...] = SECTIONS
    startup_sizes: tuple[int, ...] = (100_000, 1_000_000)
    startup_proxies: int = 1_000
    starts: int = 2
    writer_interval: float = 5.0
    history: tuple[int, ...] = (10, 10_000)
    reconciles: int = 40
    rss_proxies: int = 10_000
    rss_services: tuple[str, ...] = scale_rss.SERVICES
    health_interval: float = 30.0
    idle_window: float = 2.0
    """The rss section's settle check: a service is idle below 10% of a core over this window."""
    read_sizes: tuple[int, ...] = (10_000, 1_000_000)
    reads: int = 2_000
    read_rounds: int = 3
    lifecycle_sizes: tuple[int, ...] = (1_000, 10_000)
    lifecycle_rounds: int = 1
    timeout: float = 1_800.0
    seed: int = 1


@dataclass
class Results:
    config: Config
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "config": {k: getattr(self.config, k) for k in self.config.__dataclass_fields__},
            "sections": self.sections,
        }


def timed(say: Callable[[str], None], name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Stamps a section's result with its wall time and the load around it."""
    started, before = time.perf_counter(), load()

    def done(result: dict[str, Any]) -> dict[str, Any]:
        seconds = time.perf_counter() - started
        result["wall_seconds"] = round(seconds, 1)
        result["load_before"] = [round(v, 2) for v in before]
        result["load_after"] = [round(v, 2) for v in load()]
        loads = f"load {result['load_before'][0]} -> {result['load_after'][0]}"
        say(f"{name}: {seconds:,.0f} s, {loads}")
        return result

    return done


# ---------------------------------------------------------------------------------- sections


async def startup(tmp: Path, config: Config, say: Callable[[str], None]) -> dict[str, Any]:
    report = await scale_startup.measure(
        tmp,
        list(config.startup_sizes),
        proxies=config.startup_proxies,
        starts=config.starts,
        writer_interval=config.writer_interval,
        timeout=config.timeout,
        seed=config.seed,
        say=say,
    )
    return report.as_json()


async def reconcile(tmp: Path, config: Config, say: Callable[[str], None]) -> dict[str, Any]:
    report = await scale_reconcile.measure(
        tmp, list(config.history), reconciles=config.reconciles, seed=config.seed, say=say
    )
    return report.as_json()


async def rss(tmp: Path, config: Config, say: Callable[[str], None]) -> dict[str, Any]:
    report = await scale_rss.measure(
        tmp,
        proxies=config.rss_proxies,
        health_interval=config.health_interval,
        timeout=config.timeout,
        services=config.rss_services,
        idle_window=config.idle_window,
        say=say,
    )
    return report.as_json()


async def reads(tmp: Path, config: Config, say: Callable[[str], None]) -> dict[str, Any]:
    """The aggregate-read part is ``bench.scale_reads`` (its ``measure``, which serves every size
    at once and interleaves them round by round); called here when it is installed."""
    del tmp
    try:
        from bench import scale_reads  # noqa: PLC0415 - optional: another module's benchmark
    except ImportError:
        return {"skipped": "bench/scale_reads.py is not present"}
    before = load()
    reports = await scale_reads.measure(
        list(config.read_sizes), reads=config.reads, rounds=config.read_rounds, seed=config.seed
    )
    after = load()
    ratios = scale_reads.growth(reports)
    for report in reports:
        say(f"reads, {report.size:,} messages: filled in {report.fill.seconds:,.1f} s")
    store = ratios.get("store", {})
    worst = max((figures[0] for figures in store.values()), default=None)
    return {
        "summary": {
            "sizes": [
                {
                    "size": r.size,
                    "fill_seconds": round(r.fill.seconds, 1),
                    "readers": r.summary(),
                    "load": [round(before[0], 2), round(after[0], 2)],
                }
                for r in reports
            ],
            "growth": {name: {k: list(v) for k, v in row.items()} for name, row in ratios.items()},
            "targets": {
                "store_growth": {
                    "value": worst,
                    "target": scale_reads.GROWTH_TARGET,
                    "met": worst is not None and worst <= scale_reads.GROWTH_TARGET,
                }
            },
        }
    }


async def lifecycle(tmp: Path, config: Config, say: Callable[[str], None]) -> dict[str, Any]:
    from bench import lifecycle as bench_lifecycle  # noqa: PLC0415 - heavy, only when asked
    from bench.lifecycle_worker import Options, show_logs  # noqa: PLC0415

    options = Options(timeout=config.timeout, log_level="warning")
    runs: list[dict[str, Any]] = []
    for size in config.lifecycle_sizes:
        parsed = bench_lifecycle.resources(size)
        for r in range(config.lifecycle_rounds):
            work = tmp / f"lifecycle-{size}-{r}"
            work.mkdir(parents=True)
            try:
                run = await bench_lifecycle.run_once(work, 1, parsed, options)
            except Exception:
                show_logs(work)
                raise
            cpu_ms = 1000 * sum(run.cpu.values()) / size
            system_ms = 1000 * sum(v for k, v in run.cpu.items() if k != "bench") / size
            services = [v for k, v in run.cpu.items() if k not in ("bench", "nats-server")]
            runs.append(
                {
                    "proxies": size,
                    "seconds": round(run.seconds, 2),
                    "ready": run.ready,
                    "one_instance_each": run.one_instance_each,
                    "cpu_ms_per_proxy": round(cpu_ms, 2),
                    "cpu_ms_per_proxy_by_process": {
                        k: round(1000 * v / size, 2) for k, v in run.cpu.items()
                    },
                    "system_cpu_ms_per_proxy": round(system_ms, 2),
                    "busiest_service_cpu_ms_per_proxy": round(1000 * max(services) / size, 2),
                    "cores_used": round(sum(run.cpu.values()) / run.seconds, 2),
                    "load": round(run.load, 2),
                }
            )
            say(
                f"lifecycle, {size:,} proxies: all Ready in {run.seconds:.1f} s, "
                f"{cpu_ms:.1f} CPU ms per proxy (load {run.load:.2f})"
            )
    return {"summary": lifecycle_summary(runs, config), "runs": runs}


def lifecycle_summary(runs: list[dict[str, Any]], config: Config) -> dict[str, Any]:
    by: dict[int, list[dict[str, Any]]] = {}
    for run in runs:
        by.setdefault(run["proxies"], []).append(run)
    rows = {
        size: {
            "seconds": statistics.median(r["seconds"] for r in rs),
            "cpu_ms_per_proxy": statistics.median(r["cpu_ms_per_proxy"] for r in rs),
            "system_cpu_ms_per_proxy": statistics.median(r["system_cpu_ms_per_proxy"] for r in rs),
            "busiest_service_cpu_ms_per_proxy": statistics.median(
                r["busiest_service_cpu_ms_per_proxy"] for r in rs
            ),
            "cores_used": statistics.median(r["cores_used"] for r in rs),
            "one_instance_each": all(r["one_instance_each"] for r in rs),
        }
        for size, rs in sorted(by.items())
    }
    sizes = sorted(rows)
    targets: dict[str, Any] = {}
    largest = sizes[-1] if sizes else 0
    targets["all_ready_seconds"] = {
        "value": rows[largest]["seconds"] if sizes else None,
        "at": largest,
        "target": LIFECYCLE_SECONDS_TARGET,
        "met": bool(sizes)
        and largest >= LIFECYCLE_SECONDS_AT
        and rows[largest]["seconds"] <= LIFECYCLE_SECONDS_TARGET,
        "measured_at_target_size": largest >= LIFECYCLE_SECONDS_AT,
    }
    if sizes:
        rate = 1000 / rows[largest]["system_cpu_ms_per_proxy"]
        targets["proposed_system_proxies_per_cpu_second"] = {
            "value": round(rate, 1),
            "at": largest,
            "target": SYSTEM_RATE_TARGET,
            "met": largest >= LIFECYCLE_SECONDS_AT and rate >= SYSTEM_RATE_TARGET,
        }
        busiest = rows[largest]["busiest_service_cpu_ms_per_proxy"]
        targets["proposed_busiest_service_cpu_ms_per_proxy"] = {
            "value": busiest,
            "at": largest,
            "target": PROCESS_CPU_MS_TARGET,
            "met": largest >= LIFECYCLE_SECONDS_AT and busiest <= PROCESS_CPU_MS_TARGET,
        }
    if len(sizes) >= 2:
        growth = rows[sizes[-1]]["cpu_ms_per_proxy"] / rows[sizes[0]]["cpu_ms_per_proxy"]
        targets["cpu_per_proxy_growth"] = {
            "value": round(growth, 2),
            "between": [sizes[0], sizes[-1]],
            "target": LIFECYCLE_CPU_GROWTH_TARGET,
            "met": growth <= LIFECYCLE_CPU_GROWTH_TARGET,
        }
    del config
    return {"sizes": {str(k): v for k, v in rows.items()}, "targets": targets}


RUNNERS = {
    "startup": startup,
    "reconcile": reconcile,
    "rss": rss,
    "reads": reads,
    "lifecycle": lifecycle,
}


def section_dir(tmp: Path, name: str) -> Path:
    path = tmp / name
    path.mkdir(parents=True, exist_ok=True)
    return path


async def run(
    tmp: Path,
    config: Config,
    say: Callable[[str], None] = print,
    after_each: Callable[[Results], None] = lambda _: None,
) -> Results:
    """Every section of ``config`` in turn, each in its own directory under ``tmp``. A section
    that fails is recorded as failed and the others still run; ``after_each`` sees the results
    after every section (the command line writes its JSON file there)."""
    results = Results(config)
    for name in config.sections:
        done = timed(say, name)
        try:
            result = await RUNNERS[name](section_dir(tmp, name), config, say)
        except Exception as exc:
            say(f"{name}: FAILED: {type(exc).__name__}: {exc}")
            result = {"failed": f"{type(exc).__name__}: {exc}"}
        results.sections[name] = done(result)
        after_each(results)
    return results


# --------------------------------------------------------------------------------- rendering


def verdict(target: dict[str, Any]) -> str:
    return "met" if target.get("met") else "NOT met"


def render(results: Results, console: Console) -> None:
    s = {name: r for name, r in results.sections.items() if "failed" not in r}
    for name, r in results.sections.items():
        if "failed" in r:
            console.print(f"{name}: FAILED ({r['failed']})")
    if "startup" in s:
        summary = s["startup"]["summary"]
        table = Table(title="1. discovery start-up, process start -> /healthz 200 (median)")
        columns = ("lease events", "fill", "before s", "after s", "in service s", "views", "load")
        for column in columns:
            table.add_column(column, justify="right")
        for row in summary["sizes"]:
            table.add_row(
                f"{row['lease_events']:,}",
                f"{row['lease_fill_seconds']:,.1f} s",
                f"{row['before_s']:.2f}",
                f"{row['after_s']:.2f}",
                f"{row['before_in_service_s']:.2f} / {row['after_in_service_s']:.2f}",
                f"{row['before_restored_views']} / {row['after_restored_views']}",
                f"{min(row['loads']):.1f}-{max(row['loads']):.1f}",
            )
        console.print(table)
        console.print(
            f"empty store: {summary['empty_s']} s ({summary['empty_in_service_s']} s in service); "
            f"growth before x{summary.get('growth_before')}, after x{summary.get('growth_after')} "
            f"(in service x{summary.get('growth_after_in_service')})"
        )
        render_targets("start-up", summary["targets"], console)
    if "reconcile" in s:
        summary = s["reconcile"]["summary"]
        table = Table(title="2. decide-and-append (Reconciler.reconcile)")
        for column in (
            "history",
            "mode",
            "p50 ms",
            "p90 ms",
            "events read",
            "CPU ms client/server",
            "load",
        ):
            table.add_column(column, justify="right")
        for row in summary["cases"]:
            table.add_row(
                f"{row['history']:,}",
                row["mode"],
                f"{row['p50_ms']}",
                f"{row['p90_ms']}",
                f"{row['events_read']}",
                f"{row['client_cpu_ms']} / {row['server_cpu_ms']}",
                f"{row['load'][0]:.1f}-{row['load'][1]:.1f}",
            )
        console.print(table)
        console.print(
            f"growth before x{summary.get('growth_before')}, after x{summary.get('growth_after')}"
        )
        render_targets("reconcile", summary["targets"], console)
    if "rss" in s:
        summary = s["rss"]["summary"]
        table = Table(title=f"3. resident memory with {summary['proxies']:,} proxies")
        for column in ("service", "VmRSS MB", "peak MB", "caught up s", "appended", "load", "note"):
            table.add_column(column, justify="right")
        for name, row in summary["services"].items():
            table.add_row(
                name,
                f"{row['rss_mb']:.0f}",
                f"{row['peak_mb']:.0f}",
                f"{row['caught_up_s']:.1f}",
                str(row["appended"]),
                f"{row['load']:.1f}",
                row["note"],
            )
        console.print(table)
        for name, why in summary["skipped"].items():
            console.print(f"{name}: not measured ({why})")
        render_targets("rss", summary["targets"], console)
    if "reads" in s:
        section = s["reads"]
        if "skipped" in section:
            console.print(f"4. aggregate reads: skipped ({section['skipped']})")
        else:
            summary = section["summary"]
            table = Table(title="4. aggregate reads (medians over rounds)")
            for column in ("messages", "reader", "p50 µs", "server CPU µs/read", "load"):
                table.add_column(column, justify="right")
            for row in summary["sizes"]:
                for reader, figures in row["readers"].items():
                    table.add_row(
                        f"{row['size']:,}",
                        reader,
                        f"{figures['p50_us']:,.0f}",
                        f"{figures['server_cpu_us']:,.1f}",
                        f"{row['load'][0]:.1f}-{row['load'][1]:.1f}",
                    )
            console.print(table)
            for reader, ratio in summary["growth"].items():
                p50, cpu = ratio["p50_us"], ratio["server_cpu_us"]
                console.print(
                    f"{reader}: p50 x{p50[0]:.2f} ({p50[1]:.2f}-{p50[2]:.2f}), "
                    f"server CPU x{cpu[0]:.2f} ({cpu[1]:.2f}-{cpu[2]:.2f}), largest over smallest"
                )
            render_targets("reads", summary["targets"], console)
    if "lifecycle" in s:
        summary = s["lifecycle"]["summary"]
        table = Table(title="5. lifecycle: declared -> all Ready, 1 reconciler (median)")
        columns = (
            "proxies",
            "all Ready s",
            "CPU ms/proxy",
            "system",
            "cores used",
            "1 each",
            "load",
        )
        for column in columns:
            table.add_column(column, justify="right")
        for size, row in summary["sizes"].items():
            loads = [r["load"] for r in s["lifecycle"]["runs"] if str(r["proxies"]) == size]
            table.add_row(
                f"{int(size):,}",
                f"{row['seconds']:.1f}",
                f"{row['cpu_ms_per_proxy']:.1f}",
                f"{row['system_cpu_ms_per_proxy']:.1f}",
                f"{row['cores_used']:.2f}",
                "yes" if row["one_instance_each"] else "NO",
                f"{min(loads):.1f}-{max(loads):.1f}",
            )
        console.print(table)
        render_targets("lifecycle", summary["targets"], console)


def render_targets(section: str, targets: dict[str, Any], console: Console) -> None:
    for key, target in targets.items():
        console.print(
            f"target {section}.{key}: {target.get('value')} vs {target.get('target')}: "
            f"{verdict(target)}"
        )


# -------------------------------------------------------------------------------------- main


def sizes(text: str) -> tuple[int, ...]:
    values = tuple(int(v.replace("_", "")) for v in text.split(",") if v.strip())
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers")
    return values


def sections(text: str) -> tuple[str, ...]:
    chosen = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = set(chosen) - set(SECTIONS)
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(SECTIONS)}")
    return chosen


def services(text: str) -> tuple[str, ...]:
    chosen = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = set(chosen) - set(scale_rss.SERVICES)
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(scale_rss.SERVICES)}")
    return chosen


def parse(argv: list[str] | None = None) -> tuple[Config, argparse.Namespace]:
    d = Config()
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    p.add_argument("--only", type=sections, default=d.sections, help="sections to run")
    p.add_argument("--startup-sizes", type=sizes, default=d.startup_sizes, help="lease events")
    p.add_argument("--startup-proxies", type=int, default=d.startup_proxies)
    p.add_argument("--starts", type=int, default=d.starts, help="start-ups per size and mode")
    p.add_argument(
        "--writer-interval",
        type=float,
        default=d.writer_interval,
        help="the snapshot interval of the replica that writes the pass (the product's is 30 s)",
    )
    p.add_argument("--history", type=sizes, default=d.history, help="events per proxy")
    p.add_argument("--reconciles", type=int, default=d.reconciles, help="timed, per case")
    p.add_argument("--rss-proxies", type=int, default=d.rss_proxies)
    p.add_argument(
        "--rss-services", type=services, default=d.rss_services, help="services measured"
    )
    p.add_argument(
        "--health-interval",
        type=float,
        default=d.health_interval,
        help="the proxies' probe interval",
    )
    p.add_argument("--read-sizes", type=sizes, default=d.read_sizes, help="messages")
    p.add_argument("--reads", type=int, default=d.reads, help="reads per reader and round")
    p.add_argument("--read-rounds", type=int, default=d.read_rounds)
    p.add_argument("--lifecycle-sizes", type=sizes, default=d.lifecycle_sizes, help="proxies")
    p.add_argument("--lifecycle-rounds", type=int, default=d.lifecycle_rounds)
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds per wait")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--workdir", help="keep the stores and the services' logs here")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    config = Config(
        sections=args.only,
        startup_sizes=args.startup_sizes,
        startup_proxies=args.startup_proxies,
        starts=args.starts,
        writer_interval=args.writer_interval,
        history=args.history,
        reconciles=args.reconciles,
        rss_proxies=args.rss_proxies,
        rss_services=args.rss_services,
        health_interval=args.health_interval,
        read_sizes=args.read_sizes,
        reads=args.reads,
        read_rounds=args.read_rounds,
        lifecycle_sizes=args.lifecycle_sizes,
        lifecycle_rounds=args.lifecycle_rounds,
        timeout=args.timeout,
        seed=args.seed,
    )
    return config, args


async def _main(config: Config, workdir: Path | None, json_path: Path | None) -> Results:
    configure_logging("error")  # the benchmark's own connections would log their closing
    console = Console()
    main = asyncio.current_task()
    assert main is not None
    for sig in (signal.SIGTERM, signal.SIGINT):  # stop the services and servers it started
        asyncio.get_running_loop().add_signal_handler(sig, main.cancel)

    def say(line: str) -> None:
        console.print(line, highlight=False)

    def save(results: Results) -> None:
        if json_path is not None:
            json_path.write_text(json.dumps(results.as_json(), indent=2, default=str) + "\n")

    if workdir is not None:
        results = await run(workdir, config, say, save)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as name:
            results = await run(Path(name), config, say, save)
    render(results, console)
    return results


def main(argv: list[str] | None = None) -> None:
    config, args = parse(argv)
    workdir = Path(args.workdir).resolve() if args.workdir else None
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    json_path = Path(args.json) if args.json else None
    results = asyncio.run(_main(config, workdir, json_path))
    if any("failed" in r for r in results.sections.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
