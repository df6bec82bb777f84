"""Proxy lifecycle throughput: N proxies declared against a zero-latency fake, until all are Ready.

The provider costs nothing, so the figure is what the event log, the reconciler and the executor
cost per proxy. Each run gets a fresh nats-server with the product's configuration (an fsync per
append) and every service as its own OS process, as a deployment runs them: two reconciler
replicas can only beat one if each has a core. Runs with 1 and 2 replicas alternate which goes
first each round, because on a shared machine the load drifts within a run.

Ready is read the way any client of the system reads it, from a projection of the event log;
afterwards the log and the fake are checked for exactly one instance per proxy, so a run that
duplicated work (or skipped it) cannot pass for a fast one. The projection keeps a running count
of the Ready proxies (``ReadyCount``): counting over every view after each fetch made the
benchmark's own CPU per proxy grow with the fleet. Once the clock has stopped, a count over every
view must give the same number.

Run: ``python -m bench.lifecycle [--proxies N] [--rounds R] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nats.aio.client import Client
from rich.console import Console
from rich.table import Table

from bench.lifecycle_worker import Fleet, Options, bound, cpu_seconds, fleet, show_logs
from bench.server_requests import RequestCounter
from commands.declaring import apply
from events import subjects
from events.proxyresource import ProxyResource
from events.schemas import CreateInstance, InstanceObserved, InstanceState, Phase
from events.store import Recorded
from projections import proxy as proxy_view
from services.cli.fleet.manifests import parse_resources
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.projector import Projector
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import connect
from services.runtime.observability.logs import configure_logging

SECONDS_TARGET = 15.0
SCALING_TARGET = 1.5


@dataclass(frozen=True, slots=True)
class Run:
    replicas: int
    proxies: int
    seconds: float
    """From the first declaration until the projection shows every proxy Ready."""
    half_seconds: float
    declared_seconds: float
    ready: int
    one_create: int
    """Proxies with exactly one CreateInstance in the log, and exactly one Running observation."""
    one_running: int
    fake: dict[str, object] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds each process spent inside the timed window: who was busy, who waited."""
    requests: dict[str, int] = field(default_factory=dict)
    """Messages by kind in the timed window, when the run counted them (``--count-requests``)."""
    load: float = 0.0

    @property
    def rate(self) -> float:
        return self.ready / self.seconds if self.seconds > 0 else 0.0

    @property
    def one_instance_each(self) -> bool:
        fake = self.fake
        return (
            self.ready == self.one_create == self.one_running == self.proxies
            and fake.get("created_total") == fake.get("owners") == self.proxies
            and fake.get("max_live_per_owner") == 1
        )


def resources(count: int) -> list[ProxyResource]:
    """Parsed before the clock starts: the CLI's YAML parsing is not what is measured."""
    head = "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\n"
    body = "spec: {provider: fake, placement: {zone: a}}\n"
    docs = [f"{head}metadata: {{name: p{i}, namespace: bench}}\n{body}" for i in range(count)]
    return parse_resources("---\n".join(docs), "bench")


@dataclass(frozen=True, slots=True)
class Tally:
    creates: int = 0
    running: int = 0


def tally(current: Tally | None, recorded: Recorded) -> Tally:
    t = current or Tally()
    match recorded.event:
        case CreateInstance():
            return Tally(t.creates + 1, t.running)
        case InstanceObserved(state=InstanceState.RUNNING):
            return Tally(t.creates, t.running + 1)
        case _:
            return t


class ReadyCount:
    """The proxy view's fold, counting the proxies whose view is Ready as it folds."""

    def __init__(self) -> None:
        self.ready = 0

    def apply(self, view: proxy_view.ProxyView | None, recorded: Recorded) -> proxy_view.ProxyView:
        new = proxy_view.apply(view, recorded)
        was = view is not None and view.phase is Phase.READY
        self.ready += int(new.phase is Phase.READY) - int(was)
        return new


async def read_up_to(projector: Projector[Tally], seq: int, timeout: float) -> None:
    """Not ``catch_up``: its short no-wait fetches can return before a busy server answers,
    and a check that read nothing would find nothing wrong."""
    try:
        async with asyncio.timeout(timeout):
            while projector.last_seq < seq:
                await projector.step()
    finally:
        await projector.close()


async def run_once(
    tmp: Path, replicas: int, parsed: list[ProxyResource], options: Options | None = None
) -> Run:
    """One timed run on a fresh server: declare everything at once, wait for the last Ready."""
    options = options or Options()
    count = len(parsed)
    async with fleet(tmp, replicas, options) as running:
        conn = await connect(running.server.url, name="bench")
        try:
            await ensure_streams(conn.js)
            await bound(conn.js, "executor", 1)
            await bound(conn.js, "reconciler", replicas)
            store = JetStreamEventStore(conn.nc, conn.js)
            counted = ReadyCount()
            ready = Projector(conn.js, subjects.PROXY_STREAM, "proxy.*.*", counted.apply)
            await ready.catch_up()  # binds its consumer before the clock starts
            slots = asyncio.Semaphore(options.declare_concurrency)

            async def declare(resource: ProxyResource) -> None:
                async with slots:
                    await apply(store, resource)

            observing = await Observing.start(running, conn.nc, options)
            pids = running.pids()
            cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
            load, bench0 = os.getloadavg()[0], time.process_time()
            start = time.perf_counter()
            declaring = asyncio.gather(*(declare(r) for r in parsed))
            declared = half = 0.0
            done = 0
            while done < count and time.perf_counter() - start < options.timeout:
                await ready.step()
                now = time.perf_counter() - start
                if declaring.done() and declaring.exception() is not None:
                    break  # raised by the await below
                declared = declared or (now if declaring.done() else 0.0)
                done = counted.ready
                half = half or (now if 2 * done >= count else 0.0)
            seconds = time.perf_counter() - start
            cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
            cpu["bench"] = time.process_time() - bench0
            requests = await observing.stop()
            await declaring
            await ready.close()
            scanned = sum(v.phase is Phase.READY for v in ready.views.values())
            if scanned != done:
                raise RuntimeError(f"the running count says {done} Ready, the views {scanned}")
            log = Projector(conn.js, subjects.PROXY_STREAM, "proxy.*.*", tally)
            info = await conn.js.stream_info(subjects.PROXY_STREAM)
            await read_up_to(log, info.state.last_seq, options.timeout)
        finally:
            await conn.close()
        reports = [await w.stop() for w in running.workers]
    fake = next((r["fake"] for r in reports if r.get("role") == "executor"), {})
    return Run(
        replicas=replicas,
        proxies=count,
        seconds=seconds,
        half_seconds=half or seconds,
        declared_seconds=declared or seconds,
        ready=done,
        one_create=sum(t.creates == 1 for t in log.views.values()),
        one_running=sum(t.running == 1 for t in log.views.values()),
        fake=fake if isinstance(fake, dict) else {},
        cpu={k: round(v, 2) for k, v in cpu.items()},
        load=load,
        requests=requests,
    )


@dataclass
class Observing:
    """What a run asked to see of the server besides CPU: its messages by kind, its profile."""

    counter: RequestCounter | None
    profiling: asyncio.Task[None]

    @classmethod
    async def start(cls, running: Fleet, nc: Client, options: Options) -> Observing:
        counter = RequestCounter() if options.count_requests else None
        if counter is not None:
            await counter.start(nc)
        return cls(counter, asyncio.create_task(server_profile(running, options)))

    async def stop(self) -> dict[str, int]:
        requests = await self.counter.stop() if self.counter is not None else {}
        await self.profiling
        return requests


async def server_profile(running: Fleet, options: Options) -> None:
    """The server's CPU profile over the first ``server_profile_seconds`` of the timed window,
    from its own pprof endpoint (read it with ``go tool pprof``)."""
    if options.server_profile is None:
        return
    url = (
        f"http://127.0.0.1:{running.server.prof_port}/debug/pprof/profile"
        f"?seconds={options.server_profile_seconds}"
    )
    timeout = options.server_profile_seconds + 30
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=timeout).read())
    options.server_profile.write_bytes(body)


def spread(values: list[float]) -> list[float]:
    return [statistics.median(values), min(values), max(values)]


def summarise(runs: list[Run]) -> dict[str, dict[str, object]]:
    """Per replica count, median (min, max) over rounds. The ratio is taken per round, where
    both counts saw about the same load, and then its median."""
    by: dict[int, list[Run]] = {}
    for run in runs:
        by.setdefault(run.replicas, []).append(run)
    out: dict[str, dict[str, object]] = {}
    for k, rs in sorted(by.items()):
        out[f"k{k}"] = {
            "seconds": spread([r.seconds for r in rs]),
            "half_seconds": spread([r.half_seconds for r in rs]),
            "declared_seconds": spread([r.declared_seconds for r in rs]),
            "proxies_per_second": spread([r.rate for r in rs]),
            "cpu_seconds": {n: statistics.median(r.cpu.get(n, 0.0) for r in rs) for n in rs[0].cpu},
            "one_instance_each": all(r.one_instance_each for r in rs),
        }
    targets: dict[str, object] = {}
    for k, rs in sorted(by.items()):
        median = statistics.median(r.seconds for r in rs)
        met = median <= SECONDS_TARGET
        targets[f"seconds_k{k}"] = {"value": median, "target": SECONDS_TARGET, "met": met}
    if 1 in by and 2 in by:
        ratios = [b.rate / a.rate for a, b in zip(by[1], by[2], strict=False) if a.rate]
        ratio = spread(ratios) if ratios else [0.0, 0.0, 0.0]
        met = ratio[0] >= SCALING_TARGET
        targets["ratio_k2_k1"] = {"value": ratio, "target": SCALING_TARGET, "met": met}
    out["targets"] = targets
    return out


def render(runs: list[Run], summary: dict[str, dict[str, object]], console: Console) -> None:
    def cell(values: object, fmt: str) -> str:
        assert isinstance(values, list)
        return f"{values[0]:{fmt}} ({values[1]:{fmt}}-{values[2]:{fmt}})"

    rounds = max(sum(r.replicas == k for r in runs) for k in {r.replicas for r in runs})
    title = f"{runs[0].proxies} proxies to Ready, {rounds} rounds: median (min-max)"
    table = Table(title=title)
    for column in ("reconcilers", "all Ready s", "half Ready s", "proxies/s", "1 instance each"):
        table.add_column(column, justify="right")
    for key, row in summary.items():
        if key.startswith("k"):
            table.add_row(
                key[1:],
                cell(row["seconds"], ".2f"),
                cell(row["half_seconds"], ".2f"),
                cell(row["proxies_per_second"], ",.0f"),
                "yes" if row["one_instance_each"] else "NO",
            )
    console.print(table)
    for key, row in summary.items():
        if key.startswith("k"):
            cpu = row["cpu_seconds"]
            assert isinstance(cpu, dict)
            per = {name: 1000 * v / runs[0].proxies for name, v in cpu.items()}
            busy = ", ".join(f"{name} {v:.1f}" for name, v in per.items())
            total = sum(per.values())
            console.print(f"CPU ms per proxy, {key[1:]} reconciler(s): {busy}; total {total:.1f}")
    for run in runs:
        if run.requests:
            per_proxy = ", ".join(f"{k} {v / run.proxies:.2f}" for k, v in run.requests.items())
            console.print(f"messages per proxy by kind, {run.replicas} reconciler(s): {per_proxy}")
    for key, target in summary["targets"].items():
        assert isinstance(target, dict)
        value = target["value"]
        shown = cell(value, ".2f") if isinstance(value, list) else f"{value:.2f}"
        verdict = "met" if target["met"] else "NOT met"
        console.print(f"target {key}: {shown} vs {target['target']}: {verdict}")


async def _main(args: argparse.Namespace) -> dict[str, object]:
    configure_logging("error")  # the bench's own connection would log its close as a warning
    options = Options(
        relaxed_fsync=args.relaxed_fsync,
        declare_concurrency=args.declare_concurrency,
        log_level=args.worker_log_level,
        profile=args.profile,
        server_profile=args.server_profile,
        server_profile_seconds=args.server_profile_seconds,
        count_requests=args.count_requests,
        observe_interval=args.observe_interval,
    )
    parsed = resources(args.proxies)
    runs: list[Run] = []
    for r in range(args.rounds):
        for k in args.replicas if r % 2 == 0 else list(reversed(args.replicas)):
            with tempfile.TemporaryDirectory(prefix="bench-lifecycle-") as tmp:
                try:
                    run = await run_once(Path(tmp), k, parsed, options)
                except Exception:
                    show_logs(Path(tmp))
                    raise
            print(f"round {r + 1}, {k} reconciler(s): {run.seconds:.2f} s", flush=True)
            runs.append(run)
    summary = summarise(runs)
    render(runs, summary, Console())
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    return {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "config": {**config, "fsync_every_append": not args.relaxed_fsync},
        "summary": summary,
        "runs": [{**asdict(r), "rate": r.rate} for r in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.lifecycle", description=__doc__)
    parser.add_argument("--proxies", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--declare-concurrency", type=int, default=1_000)
    parser.add_argument("--worker-log-level", default="info", help="the services' log level")
    parser.add_argument(
        "--relaxed-fsync",
        action="store_true",
        help="experiment: no fsync per append (not the product configuration)",
    )
    parser.add_argument("--profile", help="directory for cProfile stats of every worker")
    parser.add_argument(
        "--server-profile", type=Path, help="write the nats-server's CPU profile (pprof) here"
    )
    parser.add_argument("--server-profile-seconds", type=int, default=10)
    parser.add_argument(
        "--count-requests",
        action="store_true",
        help="count the messages of the account by kind (costs the server: CPU figures of such "
        "a run do not count)",
    )
    parser.add_argument(
        "--observe-interval",
        type=float,
        default=10.0,
        help="the executor's observe sweep, seconds (the product's default); a longer one leaves "
        "the steady cost of watching a Ready fleet out of the window",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.profile:
        args.profile = Path(args.profile).resolve()
        args.profile.mkdir(parents=True, exist_ok=True)
    doc = asyncio.run(_main(args))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
