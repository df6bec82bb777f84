"""The processes of one lifecycle benchmark run: a nats-server and each service on its own.

Two reconciler replicas only have a chance of beating one if each gets a core of its own, and the
fake provider must live where the executor runs, so every service the benchmark starts is a
process of this module. It prints ``ready`` once started, and on SIGTERM shuts down cleanly and
prints one JSON line: for the executor, what the fake provider was asked to do, which is how the
benchmark checks "one instance per proxy" from outside the process.

Usage: ``python -m bench.lifecycle_worker {reconciler,executor} NATS_URL [--profile FILE]``;
``--profile`` runs the service under cProfile and writes pstats to FILE on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from bench.loops import LOOPS, loop_factory
from events import subjects
from services.executor.service import ExecutorService
from services.providers.fake import FakeProvider
from services.reconciler.service import ReconcilerService
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.logs import configure_logging
from services.runtime.ports import free_port
from services.runtime.service import Service, Started, run_services
from services.runtime.settings.shared import Settings

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("reconciler", "executor")


# ------------------------------------------------------------------------- the worker process


def fake_report(fake: FakeProvider) -> dict[str, object]:
    """What the fake saw: real creations, and the worst fleet size per owner (1 = no overlap)."""
    calls: dict[str, int] = {}
    for op, _ in fake.calls:
        calls[op] = calls.get(op, 0) + 1
    return {
        "created_total": fake.created_total,
        "live": len(fake.instances),
        "owners": len(fake.max_live_per_owner),
        "max_live_per_owner": max(fake.max_live_per_owner.values(), default=0),
        "calls": calls,
    }


async def serve(role: str, url: str, observe_interval: float) -> dict[str, object]:
    """Run until SIGTERM; the report is made after the services have stopped."""
    fake = FakeProvider(latency=0.0, pending_polls=0)
    service: Service
    if role == "executor":
        # The data dir is only for local providers, which this executor does not have.
        data_dir = Path(tempfile.gettempdir())
        service = ExecutorService(None, data_dir, observe_interval, providers={"fake": fake})
    else:
        service = ReconcilerService()
    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main.cancel)

    def started(_: Started) -> None:
        print("ready", flush=True)

    settings = Settings(nats_url=url, service_name=f"bench-{role}")
    with contextlib.suppress(asyncio.CancelledError):
        await run_services([service], settings, on_started=started)
    return {"role": role, "fake": fake_report(fake)} if role == "executor" else {"role": role}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.lifecycle_worker")
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("nats_url")
    parser.add_argument("--observe-interval", type=float, default=10.0)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--profile", help="write cProfile stats here on exit")
    parser.add_argument(
        "--loop", choices=LOOPS, default="uvloop", help="as `run` starts a service (--event-loop)"
    )
    args = parser.parse_args()
    configure_logging(args.log_level, stream=sys.stderr)
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
        report = runner.run(serve(args.role, args.nats_url, args.observe_interval))
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    print(json.dumps(report), flush=True)


# ------------------------------------------------------------------ the benchmark's side of it


def cpu_seconds(pid: int) -> float:
    """User + system time of a process (Linux /proc; 0 elsewhere, where the column is moot)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Worker:
    name: str
    process: asyncio.subprocess.Process

    async def stop(self) -> dict[str, object]:
        """SIGTERM, then the JSON line the worker prints once its services have stopped."""
        if self.process.returncode is None:
            self.process.terminate()
        out, _ = await asyncio.wait_for(self.process.communicate(), 30.0)
        lines = out.decode().strip().splitlines()
        report: dict[str, object] = json.loads(lines[-1]) if lines else {}
        return report

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


async def spawn(
    role: str,
    url: str,
    name: str,
    log: Path,
    *,
    log_level: str,
    profile: Path | None,
    observe_interval: float = 10.0,
) -> Worker:
    """Tracing stays off in workers (no OTEL_* variables): an exporter is not what is measured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    args = [sys.executable, "-m", "bench.lifecycle_worker", role, url, "--log-level", log_level]
    args += ["--observe-interval", str(observe_interval)]
    if profile is not None:
        args += ["--profile", str(profile)]
    with log.open("ab") as err:
        process = await asyncio.create_subprocess_exec(
            *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=err
        )
    worker = Worker(name, process)
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 30.0)
    except TimeoutError:
        line = b""
    if line.strip() != b"ready":
        await worker.kill()
        raise RuntimeError(f"{name} did not start; see {log}")
    return worker


@dataclass
class BenchNatsServer(EmbeddedNatsServer):
    """The product's server, with two experiments a run may ask for: ``relaxed`` (the server's
    default flush interval instead of an fsync per append, to tell how much of a run is spent
    waiting for the disk; never the product configuration) and ``prof_port`` (the server's own
    Go pprof endpoint, to profile where its CPU goes)."""

    relaxed: bool = False
    prof_port: int = 0

    def write_config(self) -> Path:
        conf = super().write_config()
        text = conf.read_text()
        if self.relaxed:
            text = text.replace("  sync_interval: always\n", "")
        if self.prof_port:
            text = f"prof_port: {self.prof_port}\n" + text
        conf.write_text(text)
        return conf


@dataclass(frozen=True, slots=True)
class Options:
    """How a run is set up; ``relaxed_fsync`` is an experiment, never the product's setting."""

    timeout: float = 300.0
    relaxed_fsync: bool = False
    declare_concurrency: int = 1_000
    log_level: str = "info"
    profile: Path | None = None
    server_profile: Path | None = None
    """Where to write the nats-server's CPU profile (Go pprof) of the timed window."""
    server_profile_seconds: int = 10
    count_requests: bool = False
    observe_interval: float = 10.0
    """The executor's observe sweep (the product's default: 10 s). A sweep asks about every
    Ready instance, so inside a longer run it costs the fleet's size per round: a steady cost of
    a Ready fleet, not of bringing it up, which a run can leave out with a longer interval."""


@dataclass
class Fleet:
    server: BenchNatsServer
    workers: list[Worker]

    def pids(self) -> dict[str, int]:
        process = self.server._process  # for CPU accounting only; the pid is not public
        pids = {w.name: w.process.pid for w in self.workers}
        return {**pids, "nats-server": process.pid if process is not None else -1}


@contextlib.asynccontextmanager
async def fleet(tmp: Path, replicas: int, options: Options) -> AsyncIterator[Fleet]:
    """A fresh server, one executor, ``replicas`` reconcilers; the caller creates the streams."""
    relaxed, profile = options.relaxed_fsync, options.profile
    prof_port = free_port("127.0.0.1") if options.server_profile is not None else 0
    server = BenchNatsServer(tmp / "nats", relaxed=relaxed, prof_port=prof_port)
    await server.start()
    running = Fleet(server, [])
    try:
        for name in ["executor"] + [f"reconciler-{i + 1}" for i in range(replicas)]:
            stats = profile / f"{name}-k{replicas}.pstats" if profile is not None else None
            role, log = name.split("-")[0], tmp / f"{name}.log"
            level = options.log_level
            worker = await spawn(
                role,
                server.url,
                name,
                log,
                log_level=level,
                profile=stats,
                observe_interval=options.observe_interval,
            )
            running.workers.append(worker)
        yield running
    finally:
        await asyncio.gather(*(w.kill() for w in running.workers))
        await server.stop()


def show_logs(tmp: Path, lines: int = 20) -> None:
    """For a failed run: its directory, logs included, is removed right afterwards."""
    for log in sorted(tmp.glob("*.log")) + sorted(tmp.glob("nats/*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- {log.name}, last {len(tail)} lines", *tail, sep="\n", file=sys.stderr)


async def bound(js: JetStreamContext, durable: str, replicas: int, timeout: float = 30.0) -> None:
    """Until every replica has a pull request waiting, so start-up is not inside the clock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(NotFoundError):
            info = await js.consumer_info(subjects.PROXY_STREAM, durable)
            if (info.num_waiting or 0) >= replicas:
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"consumer {durable} did not get {replicas} waiting pull requests")


if __name__ == "__main__":
    main()
