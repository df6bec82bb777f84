"""A bounded chaos soak: the whole system under ``kill -9``, checked against its guarantees.

Unit and integration tests kill one thing at a time, at a moment they choose. Here every
service runs as its own process under a supervisor, N local proxies (real Squids) serve a lease
load, and for the given minutes a service, a Squid or the nats-server is killed at random
moments, while requests are in flight. Afterwards the soak stops the faults and checks what
must hold whatever was killed:

- double leases: no two leases a client was given overlap on one proxy, as the clients saw them
  and as the log folds;
- acknowledged events lost: every 201/204 the clients got is in the log, as it was answered,
  and every proxy applied is still declared;
- ghost writes: nothing a client was told had failed took effect (requests with no answer at
  all are counted apart: the client cannot know, and neither can the check);
- convergence: within 60 s of the last fault every proxy is Ready, healthy and forwarding.

Each figure is computed from the records of the run (``bench.chaos_check`` holds the checks).

Run: ``python -m bench.chaos --minutes N [--proxies 50] [--seed S] [--json FILE]``; the exit
status is 1 when an invariant fails.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import chaos_check as check
from bench.chaos_fleet import ROOT, Faults, Fleet, FleetOptions, child_env, fleet, listening
from bench.chaos_hostile import CRAWLER_TOKEN, Hostile, check_hostile, run_hostile
from bench.chaos_load import LoadOptions, Record, run_load
from bench.chaos_view import StreamReader, converge, fold_proxies, serving
from bench.lifecycle_worker import show_logs
from events.customresource import cli_uid
from events.subjects import LEASE_STREAM, PROXY_STREAM
from projections.proxy import ProxyView
from services.runtime.observability.logs import configure_logging

NAMESPACE = "chaos"
ATTRIBUTES = {"pool": "chaos"}


@dataclass(frozen=True, slots=True)
class Options:
    minutes: float = 1.0
    proxies: int = 50
    seed: int = 0
    fault_interval: float = 4.0
    """Mean seconds between faults (each pause is drawn from 0.5x to 1.5x)."""
    converge_limit: float = 60.0
    ready_timeout: float = 180.0
    load: LoadOptions = field(
        default_factory=lambda: LoadOptions(selector=dict(ATTRIBUTES), token=CRAWLER_TOKEN)
    )
    fleet: FleetOptions = field(default_factory=FleetOptions)


@dataclass
class Result:
    seed: int
    proxies: int
    minutes: float
    checks: list[check.Check] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    faults_skipped: dict[str, int] = field(default_factory=dict)
    acquisitions: dict[str, int] = field(default_factory=dict)
    releases: dict[str, int] = field(default_factory=dict)
    reports: dict[str, int] = field(default_factory=dict)
    ambiguous_grants: int = 0
    withdrawn_grants: int = 0
    """Claims stored although their requester heard 503, withdrawn by discovery afterwards."""
    acquire_ms: dict[str, float] = field(default_factory=dict)
    ready_seconds: float = 0.0
    """From the apply until every proxy was Ready, healthy and forwarding, before any fault."""
    converge_seconds: float | None = None
    converge_after: dict[str, float] = field(default_factory=dict)
    """From the last fault of each kind until convergence: the last fault may be a cheap one."""
    stragglers: list[str] = field(default_factory=list)
    """Proxies not serving when the convergence wait gave up, and why."""
    phases: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    services: dict[str, dict[str, object]] = field(default_factory=dict)
    log: dict[str, int] = field(default_factory=dict)
    fault_log: list[tuple[float, str, str]] = field(default_factory=list)
    holder_uses: dict[str, int] = field(default_factory=dict)
    """The holders' requests through their proxies, by answer."""
    hostile: dict[str, dict[str, int]] = field(default_factory=dict)
    """What the hostile client was answered, by kind of attempt (``bench.chaos_hostile``)."""

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


def manifest(count: int) -> tuple[str, dict[str, str]]:
    """The Proxy documents, and the applied proxies by uid (as the CLI derives uids)."""
    docs, applied = [], {}
    for i in range(count):
        name = f"p{i}"
        docs.append(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\n"
            f"metadata: {{name: {name}, namespace: {NAMESPACE}}}\n"
            f"spec: {{provider: local, attributes: {json.dumps(ATTRIBUTES)}}}\n"
        )
        applied[cli_uid(NAMESPACE, name)] = f"{NAMESPACE}/{name}"
    return "---\n".join(docs), applied


async def apply_proxies(running: Fleet, count: int) -> dict[str, str]:
    """Through the CLI, as an operator declares them."""
    text, applied = manifest(count)
    path, log = running.tmp / "proxies.yaml", running.tmp / "apply.log"
    path.write_text(text)
    with log.open("ab") as out:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "services.cli.main", "apply", "-f", str(path)),
            *("--nats-url", running.server.url),
            cwd=ROOT,
            env=child_env(),
            stdout=out,
            stderr=out,
        )
        code = await process.wait()
    if code != 0:
        raise RuntimeError(f"apply exited with {code}; see {log}")
    return applied


def machine_busy() -> float:
    """Busy CPU seconds of the whole machine so far (every core, every process)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> tuple[float, float]:
    """(this process, its children that have exited): services, the nats-server, the CLI."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@dataclass
class Clock:
    """Wall seconds per phase of a run, printed as each phase ends."""

    console: Console
    phases: dict[str, float]
    mark: float = field(default_factory=time.monotonic)

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = round(now - self.mark, 2)
        self.mark = now
        self.console.print(f"[dim]{name}: {self.phases[name]:.1f} s[/dim]")


@dataclass
class Run:
    """What one soak keeps between its phases."""

    running: Fleet
    applied: dict[str, str]
    proxies: StreamReader
    views: dict[str, ProxyView] = field(default_factory=dict)


def judge(
    result: Result,
    record: Record,
    log: check.LeaseLog,
    run: Run,
    *,
    limit: float,
    hostile: Hostile | None = None,
) -> None:
    acquisitions, releases, reports = record.acquisitions, record.releases, record.reports
    ghosts, ambiguous, withdrawn = check.ghost_leases(acquisitions, log)
    result.checks = [
        check.check_double_leases(acquisitions, releases, log),
        check.check_lost(
            acquisitions, releases, reports, log, applied=run.applied, proxies=run.views
        ),
        ghosts,
        check.ghost_writes(releases, reports, log),
        check.check_converged(result.converge_seconds, limit, result.stragglers),
    ]
    if hostile is not None:
        result.checks.append(check_hostile(hostile))
        result.hostile = {
            "at the proxy ports": dict(hostile.proxy_answers),
            "on another client's leases": dict(hostile.lease_answers),
            "abandoned time travels": dict(hostile.travels),
            "forged credentials beside the holders' traffic": dict(hostile.forged),
            "requests leaving the crawl through its own lease": dict(hostile.escapes),
        }
    result.holder_uses = dict(record.uses)
    result.ambiguous_grants = ambiguous
    result.withdrawn_grants = withdrawn
    result.acquisitions = check.tally(a.answer for a in acquisitions)
    result.releases = check.tally(c.answer for c in releases)
    result.reports = check.tally(c.answer for c in reports)
    took = [
        1000 * (a.answer.answered_at - a.answer.sent_at)
        for a in acquisitions
        if a.answer.outcome == check.OK and a.answer.answered_at is not None
    ]
    result.acquire_ms = {"p50": pct(took, 50), "p99": pct(took, 99), "max": max(took, default=0)}
    result.log = {
        "lease events": log.events,
        "claims": sum(log.claims.values()),
        "grants": len(log.grants),
        "claims refused by the fold": log.refused,
        "writes ignored as late or unusable": log.ignored,
        "proxy events": run.proxies.last_seq,
    }


async def prepare(running: Fleet, options: Options, result: Result) -> Run:
    """Apply the proxies and wait until every one serves, before any fault."""
    applied = await apply_proxies(running, options.proxies)
    run = Run(running, applied, StreamReader(running.conn, PROXY_STREAM, "proxy.*.*"))
    started = time.time()
    ready, stragglers = await converge(
        run.proxies,
        run.views,
        applied,
        origin_port=running.origin_port,
        deadline=started + options.ready_timeout,
    )
    if ready is None:
        raise RuntimeError(f"the fleet never became ready: {stragglers[:5]}; see {running.tmp}")
    result.ready_seconds = round(ready - started, 2)
    await listening(running.api_port, 60.0)
    return run


async def chaos(run: Run, options: Options, result: Result, clock: Clock) -> tuple[Record, Hostile]:
    """The load and the hostile client under faults, then the wait for convergence while the
    load winds down."""
    running = run.running
    stop = asyncio.Event()
    record = Record()
    load_options = dataclasses.replace(options.load, origin_port=running.origin_port)
    load = asyncio.create_task(
        run_load(
            running.api_port, load_options, stop, seed=options.seed, run_id="crawler", record=record
        )
    )

    def proxies() -> dict[str, str]:
        return {uid: view.url for uid, view in run.views.items() if serving(view)}

    hostile = asyncio.create_task(
        run_hostile(
            running.api_port,
            running.origin_port,
            proxies,
            record,
            stop,
            seed=options.seed,
            selector=options.load.selector,
        )
    )
    faults = Faults(running, random.Random(options.seed))
    await faults.run(60.0 * options.minutes, options.fault_interval)
    stop.set()
    clock.lap("faults")
    last = faults.last_at or time.time()
    deadline = last + options.converge_limit
    (converged, stragglers), record, seen = await asyncio.gather(
        converge(
            run.proxies, run.views, run.applied, origin_port=running.origin_port, deadline=deadline
        ),
        load,
        hostile,
    )
    result.converge_seconds = None if converged is None else round(converged - last, 2)
    if converged is not None:
        for at, kind, _ in faults.log:
            result.converge_after[kind] = round(converged - at, 2)
    result.stragglers = stragglers
    result.faults = dict(faults.counts)
    result.faults_skipped = dict(faults.skipped)
    result.fault_log = [(round(at, 3), kind, what) for at, kind, what in faults.log]
    clock.lap("converge")
    return record, seen


async def verify(
    run: Run, record: Record, options: Options, result: Result, hostile: Hostile | None = None
) -> None:
    """Read both streams from sequence 1 and run every check."""
    fold_proxies(run.views, await run.proxies.read_all(timeout=60.0))
    leases = StreamReader(run.running.conn, LEASE_STREAM, "lease.*")
    try:
        log = check.fold_log(await leases.read_all(timeout=120.0))
    finally:
        await leases.close()
        await run.proxies.close()
    judge(result, record, log, run, limit=options.converge_limit, hostile=hostile)
    result.services = {
        name: {"starts": s.starts, "killed": s.killed, "other exits": dict(s.exits)}
        for name, s in run.running.services.items()
    }


async def soak(options: Options, tmp: Path, say: Console | None = None) -> Result:
    """One run on a fresh system in ``tmp`` (its logs stay there)."""
    result = Result(options.seed, options.proxies, options.minutes)
    clock = Clock(say or Console(quiet=True), result.phases)
    busy0, (me0, kids0), t0 = machine_busy(), own_cpu(), time.monotonic()
    async with fleet(tmp, options.fleet) as running:
        clock.lap("start")
        run = await prepare(running, options, result)
        clock.lap("ready")
        record, hostile = await chaos(run, options, result, clock)
        await verify(run, record, options, result, hostile)
        clock.lap("checks")
    clock.lap("stop")
    me, kids = own_cpu()
    result.phases["total"] = round(time.monotonic() - t0, 2)
    result.cpu = {
        "bench": round(me - me0, 1),
        "services, nats-server, CLI": round(kids - kids0, 1),
        "machine (all processes)": round(machine_busy() - busy0, 1),
    }
    return result


def shown(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
    return "never" if value is None else str(value)


def render(result: Result, console: Console) -> None:
    table = Table(
        title=f"chaos soak: {result.minutes:g} min, {result.proxies} proxies, seed {result.seed}"
    )
    for column in ("invariant", "value", "target", "verdict"):
        table.add_column(column, justify="left" if column == "invariant" else "right")
    for c in result.checks:
        value = "never" if c.value is None else f"{c.value:g}"
        verdict = "[green]ok[/green]" if c.ok else "[red]FAILED[/red]"
        table.add_row(c.name, value, c.target, verdict)
    console.print(table)
    for c in result.checks:
        for line in c.evidence:
            console.print(f"  [red]{c.name}[/red]: {line}", soft_wrap=True)
    figures = Table(title="figures", show_header=False)
    figures.add_column("", justify="left")
    figures.add_column("", justify="left")
    rows: dict[str, object] = {
        "faults injected": result.faults,
        "faults skipped (nothing alive)": result.faults_skipped,
        "acquisitions": result.acquisitions,
        "grants with no answer (ambiguous)": result.ambiguous_grants,
        "grants withdrawn after an outage": result.withdrawn_grants,
        "releases (attempts)": result.releases,
        "reports": result.reports,
        "holders' requests through their proxies": result.holder_uses,
        "acquire ms (201s)": {k: round(v, 1) for k, v in result.acquire_ms.items()},
        "Ready before faults, s": result.ready_seconds,
        "converged after last fault, s": result.converge_seconds,
        "converged after the last of each kind, s": result.converge_after,
        "event log": result.log,
        **{f"hostile, {kind}": answers for kind, answers in result.hostile.items()},
        "wall seconds": result.phases,
        "CPU seconds": result.cpu,
    }
    for name, s in result.services.items():
        rows[f"service {name}"] = s
    for key, figure in rows.items():
        figures.add_row(key, shown(figure))
    console.print(figures)
    # Last, so that a log cut to its tail (a CI summary) still says what failed and how to rerun.
    for c in result.checks:
        if not c.ok:
            console.print(f"FAILED {c.name}: {shown(c.value)} (target {c.target})", soft_wrap=True)
            for line in c.evidence:
                console.print(f"  {line}", soft_wrap=True, markup=False)
    if not result.ok:
        console.print(f"rerun with --seed {result.seed}", soft_wrap=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=1.0, help="of faults")
    parser.add_argument("--proxies", type=int, default=50)
    parser.add_argument("--seed", type=int, help="fault order and load (default: random)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent lease clients")
    parser.add_argument("--fault-interval", type=float, default=4.0, help="mean seconds")
    parser.add_argument("--workdir", type=Path, help="keep logs and data here (default: temp)")
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    options = Options(
        minutes=args.minutes,
        proxies=args.proxies,
        seed=seed,
        fault_interval=args.fault_interval,
        load=LoadOptions(clients=args.clients, selector=dict(ATTRIBUTES), token=CRAWLER_TOKEN),
    )
    configure_logging("error")  # the bench's own connection logs every server restart
    console = Console()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(soak(options, args.workdir.resolve(), console))
    else:
        with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
            try:
                result = asyncio.run(soak(options, Path(tmp), console))
            except Exception:
                show_logs(Path(tmp))  # the directory goes with the exception
                raise
    render(result, console)
    if args.json:
        doc = {**asdict(result), "ok": result.ok, "machine": {"cpus": os.cpu_count()}}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    sys.exit(0 if result.ok else 1)


if __name__ == "__main__":
    main()
