"""What the scale benchmarks share: a store filled fast and then served as the product serves it,
realistic histories written with the product's codec, and service processes observed from
outside (start-up time, ``/healthz``, ``/metrics``, resident memory).

A store is filled by a nats-server without the product's fsync after every message (at a few
hundred fsyncs a second a million events would take most of an hour), then stopped, and the
measurements run on a server started with the product's configuration on the same store: the
data is the same, only how fast it was written differs.

The proxies' histories are the ones the system writes: the declaration, the reconciler's
decisions (``services.reconciler.pure.decide``, the same pure function, on the same fold), the
executor's answers and the health verdicts, in that order. So a reconciler that reads them
decides nothing more, a health prober finds nothing to record, and every fold accepts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar, cast

from nats.js import JetStreamContext
from nats.js.api import PubAck

from events import codec, subjects
from events.schemas import (
    AnyEvent,
    CreateInstance,
    Event,
    HealthChanged,
    HealthCheck,
    InstanceCreated,
    InstanceObserved,
    InstanceState,
    LeaseAcquired,
    LeaseReleased,
    ProxyDeclared,
    ProxySpec,
)
from events.store import Recorded, derive_msg_id
from services.reconciler.pure.decide import decide
from services.reconciler.pure.view import ProxyState, fold
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.credentials import write_private
from services.runtime.nats.server import PID_FILE, EmbeddedNatsServer

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")

PROVIDER = "scale"
"""What the proxies' ``spec.provider`` names. No service process of the benchmark configures a
provider of that name, so nothing ever calls a provider about them (the executor's observe
sweep skips them): the figures are the services' own cost, never a cloud's or a Squid's."""
LIFECYCLE_EVENTS = 7
"""Events from a declaration to Ready and healthy (see ``ready_history``)."""


def load() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages (zeros where the platform has none)."""
    try:
        return os.getloadavg()
    except OSError:
        return (0.0, 0.0, 0.0)


def load1() -> float:
    return round(load()[0], 2)


# ------------------------------------------------------------------------------- the servers


class FillingServer(EmbeddedNatsServer):
    """The product's server without its fsync after every message, only to fill a store."""

    def write_config(self) -> Path:
        conf = super().write_config()
        write_private(conf, conf.read_text().replace("sync_interval: always", ""))
        return conf


@dataclass(frozen=True, slots=True)
class Filled:
    events: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


async def fill_store(data_dir: Path, fill: Callable[[Connection], Awaitable[T]]) -> T:
    """Run ``fill`` against a fast-filling server on ``data_dir``, then stop it."""
    server = FillingServer(data_dir=data_dir)
    await server.start()
    try:
        conn = await connect(server.url, name="bench-scale-fill")
        try:
            await ensure_streams(conn.js)
            return await fill(conn)
        finally:
            await conn.close()
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def product_server(data_dir: Path) -> AsyncIterator[tuple[EmbeddedNatsServer, Connection]]:
    """The product's configuration (an fsync per message) on ``data_dir``, and an admin
    connection to it."""
    server = EmbeddedNatsServer(data_dir=data_dir)
    await server.start()
    try:
        conn = await connect(server.url, name="bench-scale")
        try:
            await ensure_streams(conn.js)
            yield server, conn
        finally:
            await conn.close()
    finally:
        await server.stop()


def server_pid(server: EmbeddedNatsServer) -> int:
    return int((server.data_dir / PID_FILE).read_text().strip())


async def stored(js: JetStreamContext, stream: str) -> int:
    info = await js.stream_info(stream)
    return int(info.state.messages)


# ------------------------------------------------------------------------------ the histories


def health_check(interval: float) -> HealthCheck:
    return HealthCheck(interval_seconds=interval)


def spec(interval: float = 30.0) -> ProxySpec:
    return ProxySpec(
        provider=PROVIDER, attributes={"pool": "scale"}, health_check=health_check(interval)
    )


@dataclass
class History:
    """One proxy's history as the system writes it, built with the reconciler's own fold and
    decisions; ``events`` are (event, msg id) in log order."""

    uid: str
    events: list[tuple[Event, str]] = field(default_factory=list)
    state: ProxyState | None = None
    """The reconciler's fold of ``events``, kept as they are added."""

    def add(self, event: Event) -> None:
        seq = len(self.events) + 1
        subject = subjects.proxy(self.uid).subject_for(event)
        recorded = Recorded(cast(AnyEvent, event), seq, subject, datetime.now(UTC))
        self.state = fold(self.uid, [recorded], self.state)
        self.events.append((event, derive_msg_id("bench-scale", self.uid, str(seq))))

    def decided(self) -> tuple[Event, ...]:
        """What the reconciler decides on the history so far, appended as it would append it."""
        decision = decide(self.state or fold(self.uid, []), datetime.now(UTC))
        for event in decision.events:
            self.add(event)
        return decision.events

    @property
    def provider_id(self) -> str:
        return f"{PROVIDER}-{self.uid}"

    def verdict(self, healthy: bool, latency_ms: float = 12.0) -> None:
        reason = "Probe" if healthy else "ProbeFailed"
        message = "" if healthy else "timeout: no answer within 5s"
        self.add(
            HealthChanged(
                healthy=healthy,
                reason=reason,
                message=message,
                latency_ms=latency_ms,
                provider_id=self.provider_id,
            )
        )


def ready_history(uid: str, url: str, proxy_spec: ProxySpec | None = None) -> History:
    """Declared, created (the reconciler's command and status, the executor's answers), Ready
    (the reconciler's status) and healthy (the prober's first verdict): 7 events, after which
    the reconciler decides nothing."""
    h = History(uid)
    h.add(ProxyDeclared(uid=uid, namespace="scale", name=uid, spec=proxy_spec or spec()))
    (command, *_) = h.decided()  # CreateInstance + PhaseChanged(Provisioning)
    assert isinstance(command, CreateInstance)
    h.add(
        InstanceCreated(command_id=command.command_id, provider=PROVIDER, provider_id=h.provider_id)
    )
    h.add(
        InstanceObserved(
            command_id=command.command_id,
            provider=PROVIDER,
            provider_id=h.provider_id,
            state=InstanceState.RUNNING,
            ip="127.0.0.1",
            url=url,
        )
    )
    h.decided()  # PhaseChanged(Ready)
    h.verdict(True)
    assert not h.decided(), "a Ready, healthy proxy must leave the reconciler nothing to do"
    assert len(h.events) == LIFECYCLE_EVENTS
    return h


def flapping_history(uid: str, total: int, url: str = "http://127.0.0.1:3128") -> History:
    """A Ready proxy whose health then flapped: each flap is the prober's verdict and the
    reconciler's status answering it. ``total`` events exactly (at least 7); an odd remainder is
    a latency verdict, which changes no decision. Settled: the reconciler has nothing to add."""
    h = ready_history(uid, url)
    healthy = True
    while len(h.events) + 2 <= total:
        healthy = not healthy
        h.verdict(healthy)
        h.decided()
    if len(h.events) < total:
        h.verdict(healthy, latency_ms=13.0)
        assert not h.decided()
    assert len(h.events) == total
    return h


def lease_pair(uid: str, n: int) -> tuple[tuple[Event, str], tuple[Event, str]]:
    """The ``n``-th lease of a proxy: acquired for 5 minutes, released (no cooldown), as the
    discovery API writes them; the fold grants and ends it."""
    lease_id = derive_msg_id("bench-scale-lease", uid, str(n))[:32]
    acquired = LeaseAcquired(
        lease_id=lease_id,
        proxy_uid=uid,
        holder=f"crawler-{n % 97}",
        ttl_seconds=300.0,
        requested_ttl_seconds=300.0,
        selector={"pool": "scale"},
        fencing_token=n + 1,
    )
    released = LeaseReleased(lease_id=lease_id, proxy_uid=uid)
    return (acquired, f"acquire-{lease_id}"), (released, f"release-{lease_id}")


# ------------------------------------------------------------------------------- publishing


@dataclass
class Publisher:
    """``js.publish_async`` with the product's codec and envelope, never awaiting one
    acknowledgement at a time: they are gathered every ``window`` messages. One connection keeps
    the order of what it publishes, so each aggregate's events are stored in the order given."""

    js: JetStreamContext
    window: int = 2_000
    published: int = 0
    failed: int = 0
    _acks: list[asyncio.Future[PubAck]] = field(default_factory=list)

    async def publish(self, subject: str, event: Event, msg_id: str) -> None:
        headers = codec.envelope_headers(event, msg_id)
        self._acks.append(
            await self.js.publish_async(subject, codec.encode(event), headers=headers)
        )
        self.published += 1
        if len(self._acks) >= self.window:
            await self.flush()

    async def history(self, history: History) -> None:
        aggregate = subjects.proxy(history.uid)
        for event, msg_id in history.events:
            await self.publish(aggregate.subject_for(event), event, msg_id)

    async def flush(self) -> None:
        results = await asyncio.gather(*self._acks, return_exceptions=True)
        self._acks.clear()
        self.failed += sum(isinstance(r, BaseException) for r in results)

    async def done(self) -> None:
        await self.flush()
        if self.failed:
            raise RuntimeError(f"{self.failed} of {self.published} publishes failed")


def proxy_uid(i: int) -> str:
    return f"s{i:06d}"


async def publish_fleet(js: JetStreamContext, histories: Iterator[History]) -> Filled:
    """Every history, proxy after proxy; timed from the first publish to the last ack."""
    started = time.perf_counter()
    publisher = Publisher(js)
    for history in histories:
        await publisher.history(history)
    await publisher.done()
    return Filled(publisher.published, time.perf_counter() - started)


# --------------------------------------------------------------------------- the processes


def child_env() -> dict[str, str]:
    """Tracing stays off in the services (no OTEL_* variables): an exporter is not measured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def service_argv(name: str, nats_url: str, metrics_port: int, *flags: str) -> list[str]:
    """``egress-proxies run NAME`` as a deployment runs it, logging JSON."""
    cli = [sys.executable, "-m", "services.cli.main", "--log-level", "info", "--log-format", "json"]
    return [*cli, "run", name, "--nats-url", nats_url, "--metrics-port", str(metrics_port), *flags]


@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process
    log: Path
    started: float
    """``time.perf_counter()`` just before the process was created."""

    @property
    def pid(self) -> int:
        return self.process.pid

    async def stop(self, timeout: float = 20.0) -> int:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), timeout)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        return self.process.returncode or 0

    def check_alive(self) -> None:
        if self.process.returncode is not None:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{tail}")


async def spawn(name: str, argv: list[str], log: Path) -> Child:
    with log.open("ab") as out:
        started = time.perf_counter()
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=ROOT,
            env=child_env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    return Child(name, process, log, started)


@contextlib.asynccontextmanager
async def running(name: str, argv: list[str], log: Path) -> AsyncIterator[Child]:
    child = await spawn(name, argv, log)
    try:
        yield child
    finally:
        await child.stop()


def memory(pid: int) -> dict[str, float]:
    """``VmRSS`` (resident now) and ``VmHWM`` (the peak) in MB from ``/proc/<pid>/status``."""
    out: dict[str, float] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def idle(pid: int, *, share: float = 0.1, window: float = 2.0, limit: float = 120.0) -> float:
    """Wait until the process uses less than ``share`` of a core over ``window``; returns its
    share over the last window (the caller reports it when the limit ran out first)."""
    deadline = time.monotonic() + limit
    while True:
        before = cpu_seconds(pid)
        await asyncio.sleep(window)
        used = (cpu_seconds(pid) - before) / window
        if used < share or time.monotonic() > deadline:
            return used


async def http_get(port: int, path: str, timeout: float) -> tuple[int, bytes]:
    """One HTTP/1.0 GET on 127.0.0.1: the status and the body (``(0, b"")`` for no answer)."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
                await writer.drain()
                data = await reader.read()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError):
        return 0, b""
    head, _, body = data.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    try:
        return int(parts[1]), body
    except (IndexError, ValueError):
        return 0, b""


async def listening(child: Child, port: int, timeout: float) -> None:
    """Until something accepts connections on 127.0.0.1:``port``."""
    deadline = time.perf_counter() + timeout
    while True:
        child.check_alive()
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{child.name}: nothing listens on {port}") from None
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


async def until_healthz(child: Child, port: int, timeout: float) -> float:
    """Seconds from the process's creation to the first ``GET /healthz`` answered 200.

    Discovery binds its socket before catching up and serves only after, so a request sent
    meanwhile waits in the socket's backlog and is answered the moment serving starts: each
    request is given a few seconds, and a refused one is retried 20 ms later.
    """
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        child.check_alive()
        status, _ = await http_get(port, "/healthz", 5.0)
        if status == 200:
            return time.perf_counter() - child.started
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{child.name}: /healthz not 200 within {timeout:.0f} s; see {child.log}")


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus metric's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key != name and not key.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in key for k, v in labels.items()):
            with contextlib.suppress(ValueError):
                total += float(value)
    return total


async def scrape(port: int) -> str:
    status, body = await http_get(port, "/metrics", 5.0)
    return body.decode(errors="replace") if status == 200 else ""


def log_events(path: Path, event: str) -> list[dict[str, object]]:
    """The JSON log lines of a service whose ``event`` is ``event``."""
    found: list[dict[str, object]] = []
    if not path.exists():
        return found
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            found.append(record)
    return found


def log_time(path: Path, event: str) -> datetime | None:
    """The timestamp of a service's first log line whose event is ``event``."""
    found = log_events(path, event)
    return datetime.fromisoformat(str(found[0]["timestamp"])) if found else None
