"""The processes of a chaos soak, and the faults done to them.

Every service runs as ``egress-proxies run NAME``, an OS process of its own with the flags a
deployment would give it, under a supervisor that starts it again whenever it dies, as
Kubernetes restarts a container. The nats-server is the embedded one, killed with SIGKILL and
started again on the same store and port. The Squids are the local provider's, found through
the pid files it keeps next to each instance: the soak kills what a crash would kill, and knows
no more about the system than an operator on the machine would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos_hostile import clients_file
from services.providers import local_process as proc
from services.providers.local import LocalProvider
from services.providers.squidauth.secret import SECRET_ENV, SECRET_FILE_ENV
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer, NatsServerError
from services.runtime.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("reconciler", "executor", "health", "gc", "discovery")
SERVICE = "service"
SQUID = "squid"
NATS = "nats-server"
KINDS = (SERVICE, SQUID, NATS)


@dataclass(frozen=True, slots=True)
class FleetOptions:
    restart_delay: float = 1.0
    """A supervisor's pause before starting a dead service again."""
    observe_interval: float = 2.0
    lease_cooldown: str = "1s"
    gc_interval: str = "10s"
    gc_grace: str = "1m"
    log_level: str = "info"


LEASE_SECRET = secrets.token_hex(32)
"""The soak's master lease secret: its proxies enforce leases
(docs/decisions/0084-leases-enforced-at-the-proxy.md), and the executor, discovery and health must
share it."""


def child_env() -> dict[str, str]:
    """Tracing stays off in the services (no OTEL_* variables): an exporter is not under test.
    Every service gets the soak's lease secret."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.pop(SECRET_FILE_ENV, None)
    env[SECRET_ENV] = LEASE_SECRET
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@dataclass
class Supervised:
    """One service process, started again after ``restart_delay`` whenever it exits."""

    name: str
    argv: list[str]
    log: Path
    restart_delay: float
    process: asyncio.subprocess.Process | None = None
    starts: int = 0
    killed: int = 0
    """Exits the soak caused."""
    exits: Counter[int] = field(default_factory=Counter)
    """Exit codes of the exits it did not cause."""
    _doomed: set[int] = field(default_factory=set)
    _stopping: bool = False
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"supervise-{self.name}")

    async def _supervise(self) -> None:
        while not self._stopping:
            with self.log.open("ab") as out:
                process = await asyncio.create_subprocess_exec(
                    *self.argv,
                    cwd=ROOT,
                    env=child_env(),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                )
            self.process = process
            self.starts += 1
            code = await process.wait()
            if process.pid in self._doomed:
                self.killed += 1
            elif not self._stopping:
                self.exits[code] += 1
            if not self._stopping:
                await asyncio.sleep(self.restart_delay)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def kill(self) -> bool:
        process = self.process
        if process is None or process.returncode is not None:
            return False
        self._doomed.add(process.pid)
        process.kill()
        return True

    async def stop(self) -> None:
        self._stopping = True
        process = self.process
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 15.0)
            except TimeoutError:
                process.kill()
                await process.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@dataclass
class Fleet:
    tmp: Path
    server: EmbeddedNatsServer
    conn: Connection
    api_port: int
    origin_port: int
    services: dict[str, Supervised] = field(default_factory=dict)

    @property
    def local_dir(self) -> Path:
        """The local provider's data dir (the executor's ``--data-dir`` + ``local``)."""
        return self.tmp / "data" / "local"

    def squids(self) -> dict[str, int]:
        """Live Squids by instance name, from the pid files the provider keeps."""
        found = {}
        instances = self.local_dir / "instances"
        for path in sorted(instances.iterdir()) if instances.is_dir() else []:
            pid = proc.read_pid(path)
            if pid and proc.is_running(pid, path):
                found[path.name] = pid
        return found


def service_argv(name: str, fleet: Fleet, options: FleetOptions) -> list[str]:
    """The flags a deployment gives each service; ``--metrics-port 0`` since they share a host."""
    data = str(fleet.tmp / "data")
    flags = {
        "reconciler": [],
        "executor": [
            *("--data-dir", data, "--observe-interval", str(options.observe_interval)),
            *("--create-timeout", "60"),
        ],
        "health": [
            *("--health-check-url", f"http://127.0.0.1:{fleet.origin_port}/"),
            *("--health-heartbeat", "1"),
        ],
        "gc": [
            *("--data-dir", data),
            *("--gc-interval", options.gc_interval, "--gc-grace", options.gc_grace),
        ],
        "discovery": [
            *("--port", str(fleet.api_port), "--lease-cooldown", options.lease_cooldown),
            *("--clients-file", str(fleet.tmp / "clients.yaml")),
        ],
    }[name]
    cli = [sys.executable, "-m", "services.cli.main", "--log-level", options.log_level, "run"]
    return [*cli, name, "--nats-url", fleet.server.url, "--metrics-port", "0", *flags]


async def listening(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await proc.accepts(port, timeout=0.5):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


async def start_server(server: EmbeddedNatsServer, attempts: int = 5) -> None:
    """On the same store and port; a restart may fail while the old socket lingers."""
    for attempt in range(1, attempts + 1):
        try:
            await server.start()
            return
        except (NatsServerError, OSError):
            if attempt == attempts:
                raise
            await asyncio.sleep(1.0)


@contextlib.asynccontextmanager
async def fleet(tmp: Path, options: FleetOptions) -> AsyncIterator[Fleet]:
    """A fresh nats-server, a loopback origin for health checks, and every service supervised."""
    server = EmbeddedNatsServer(tmp / "nats")
    await server.start()
    origin: asyncio.subprocess.Process | None = None
    running: Fleet | None = None
    try:
        conn = await connect(server.url, name="chaos-bench")
        await ensure_streams(conn.js)
        running = Fleet(tmp, server, conn, api_port=free_port(), origin_port=free_port())
        (tmp / "origin").mkdir(exist_ok=True)
        origin = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "http.server", str(running.origin_port)),
            *("--bind", "127.0.0.1", "--directory", str(tmp / "origin")),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await listening(running.origin_port, 15.0)
        # Two clients of the API: the crawlers' and a hostile one's (bench.chaos_hostile).
        (tmp / "clients.yaml").write_text(clients_file())
        for name in SERVICES:
            argv = service_argv(name, running, options)
            supervised = Supervised(name, argv, tmp / f"{name}.log", options.restart_delay)
            running.services[name] = supervised
            supervised.start()
        yield running
    finally:
        if running is not None:
            await asyncio.gather(*(s.stop() for s in running.services.values()))
            await stop_squids(running.local_dir)
            await running.conn.close()
        if origin is not None and origin.returncode is None:
            origin.kill()
            await origin.wait()
        await server.stop()


async def stop_squids(local_dir: Path) -> None:
    """The proxies outlive the executor by design; the soak must not leave them behind."""
    if not (local_dir / "instances").is_dir():
        return
    provider = LocalProvider("local", local_dir, stop_grace=0.5)
    try:
        instances = await provider.list_by_tag()
    except Exception as exc:
        # Said, not raised: this runs while unwinding, and must not hide why the soak stopped.
        print(f"cannot list the Squids to stop them: {exc}", file=sys.stderr)
        return
    await asyncio.gather(
        *(provider.delete(i.provider_id) for i in instances), return_exceptions=True
    )


@dataclass
class Faults:
    """Kills, one kind after another in a shuffled order, so every kind comes up in turn."""

    fleet: Fleet
    rng: random.Random
    nats_down: tuple[float, float] = (0.5, 2.0)
    counts: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    log: list[tuple[float, str, str]] = field(default_factory=list)
    """(time, kind, what) of every fault injected."""
    last_at: float = 0.0
    _bag: list[str] = field(default_factory=list)

    def next_kind(self) -> str:
        if not self._bag:
            self._bag = list(KINDS)
            self.rng.shuffle(self._bag)
        return self._bag.pop()

    async def inject(self, kind: str) -> None:
        what = ""
        if kind == SERVICE:
            alive = [s for s in self.fleet.services.values() if s.alive]
            victim = self.rng.choice(alive) if alive else None
            what = victim.name if victim is not None and victim.kill() else ""
        elif kind == SQUID:
            squids = self.fleet.squids()
            if squids:
                what = self.rng.choice(sorted(squids))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(squids[what], signal.SIGKILL)
        else:
            self.last_at = time.time()
            await self.fleet.server.kill()
            await asyncio.sleep(self.rng.uniform(*self.nats_down))
            await start_server(self.fleet.server)
            what = "restarted on the same store"
        if not what:
            self.skipped[kind] += 1  # nothing of that kind was alive to kill
            return
        if kind != NATS:
            self.last_at = time.time()
        self.counts[kind] += 1
        self.log.append((self.last_at, kind, what))

    async def run(self, seconds: float, interval: float) -> None:
        """Faults for ``seconds``, about one per ``interval``; returns when the time is up."""
        deadline = time.monotonic() + seconds
        while True:
            pause = self.rng.uniform(0.5 * interval, 1.5 * interval)
            left = deadline - time.monotonic()
            if pause >= left:
                await asyncio.sleep(max(0.0, left))
                return
            await asyncio.sleep(pause)
            await self.inject(self.next_kind())
