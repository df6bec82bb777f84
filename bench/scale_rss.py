"""Resident memory of each service with a fleet of ``proxies`` in its views.

The ``PROXY`` stream holds ``proxies`` proxies as the system leaves them Ready and healthy
(``ready_history``). Each service is then started on its own, as ``egress-proxies run NAME``
with the flags a deployment gives it, and measured once it has caught up:

- discovery: ``GET /healthz`` answers 200 (it serves only once its views have caught up);
- reconciler: its durable consumer has nothing pending and nothing unacknowledged;
- executor: the same for its consumer, and its observe sweep (which folds the whole stream)
  has finished;
- gc: one sweep done (``egress_gc_sweeps_total{result="swept"}``), which folds the whole stream;
- health: it owns every proxy and has probed as many times as there are proxies (each proxy's
  first probe is spread over its interval), so every probe task exists, and every kept-alive
  connection (one per proxy when the interval is within ``--health-keep-alive``, none when
  it is longer, as at the default 30 s). The proxies' URLs all lead to one small origin process
  (``bench.scale_worker origin``) that answers every request 204, each proxy under its own URL,
  so the prober keeps one connection per proxy as it would with real proxies.

After the signal, the benchmark waits until the process is idle (health never is: it probes),
then reads ``VmRSS`` (resident now) and ``VmHWM`` (the peak so far) from ``/proc``. It also
checks that no service appended anything: the fleet was settled, so a service that wrote would
have been doing work this benchmark does not mean to measure.

The executor and gc get a providers file with one ``fake`` provider: the proxies name another
(``scale``), so neither calls a provider about them. The watcher is not measured: it needs a
Kubernetes API server and holds no view of the ``PROXY`` stream.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nats.js.errors import NotFoundError

from bench.scale_fleet import (
    Child,
    Filled,
    History,
    cpu_seconds,
    fill_store,
    http_get,
    idle,
    listening,
    load1,
    memory,
    metric,
    product_server,
    proxy_uid,
    publish_fleet,
    ready_history,
    running,
    scrape,
    service_argv,
    spawn,
    spec,
)
from events import subjects
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.ports import free_port

RSS_TARGET_MB = 150.0
SERVICES = ("discovery", "reconciler", "executor", "gc", "health")
SKIPPED = {"watcher": "needs a Kubernetes API server; it keeps no view of the PROXY stream"}
PROVIDERS = "providers:\n  - name: fake\n    type: fake\n    fake: {}\n"


@dataclass(frozen=True, slots=True)
class Measured:
    service: str
    rss_mb: float
    peak_mb: float
    caught_up_s: float
    """Process created -> the service's caught-up signal."""
    cpu_s: float
    """CPU seconds the process used until measured."""
    appended: int
    """Events the service appended to ``PROXY`` (0 expected: the fleet is settled)."""
    idle_share: float
    """Its CPU share of a core over the last 2 s before the reading."""
    load: float
    note: str = ""


@dataclass
class RssReport:
    proxies: int
    fill: Filled
    health_interval: float
    measured: list[Measured] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        rows = {
            m.service: {
                "rss_mb": m.rss_mb,
                "peak_mb": m.peak_mb,
                "caught_up_s": round(m.caught_up_s, 1),
                "cpu_s": round(m.cpu_s, 1),
                "appended": m.appended,
                "load": m.load,
                "note": m.note,
            }
            for m in self.measured
        }
        worst = max((m.rss_mb for m in self.measured), default=0.0)
        return {
            "proxies": self.proxies,
            "fill_seconds": round(self.fill.seconds, 1),
            "services": rows,
            "skipped": SKIPPED,
            "targets": {
                "rss_mb": {
                    "value": worst,
                    "target": RSS_TARGET_MB,
                    "met": bool(self.measured) and worst <= RSS_TARGET_MB,
                    "over": [m.service for m in self.measured if m.rss_mb > RSS_TARGET_MB],
                }
            },
        }

    def as_json(self) -> dict[str, object]:
        return {
            "summary": self.summary(),
            "fill": asdict(self.fill),
            "measured": [asdict(m) for m in self.measured],
        }


async def drained(conn: Connection, durable: str) -> bool:
    try:
        info = await conn.js.consumer_info(subjects.PROXY_STREAM, durable)
    except NotFoundError:
        return False
    return (info.num_pending or 0) == 0 and (info.num_ack_pending or 0) == 0


Signal = Callable[[], Awaitable[bool]]


def caught_up_signal(
    name: str, conn: Connection, proxies: int, api_port: int, metrics_port: int
) -> Signal:
    async def discovery() -> bool:
        status, _ = await http_get(api_port, "/healthz", 5.0)
        return status == 200

    async def reconciler() -> bool:
        return await drained(conn, "reconciler")

    async def executor() -> bool:
        return await drained(conn, "executor")

    async def gc() -> bool:
        return metric(await scrape(metrics_port), "egress_gc_sweeps_total", result="swept") >= 1

    async def health() -> bool:
        text = await scrape(metrics_port)
        if "egress_health_owned_proxies" not in text:
            return False  # not serving its metrics yet
        owned = metric(text, "egress_health_owned_proxies")
        probes = metric(text, "egress_health_probes_total")
        return owned >= proxies and probes >= proxies

    signals: dict[str, Signal] = {
        "discovery": discovery,
        "reconciler": reconciler,
        "executor": executor,
        "gc": gc,
        "health": health,
    }
    return signals[name]


def flags(name: str, tmp: Path, api_port: int, origin_port: int) -> list[str]:
    providers = tmp / "providers.yaml"
    providers.write_text(PROVIDERS)
    data = str(tmp / "data")
    return {
        "discovery": ["--port", str(api_port)],
        "reconciler": [],
        "executor": ["--providers-config", str(providers), "--data-dir", data],
        "gc": ["--providers-config", str(providers), "--data-dir", data],
        "health": ["--health-check-url", f"http://127.0.0.1:{origin_port}/generate_204"],
    }[name]


async def last_seq(conn: Connection) -> int:
    info = await conn.js.stream_info(subjects.PROXY_STREAM)
    return int(info.state.last_seq)


async def measure_service(
    name: str,
    server: EmbeddedNatsServer,
    conn: Connection,
    tmp: Path,
    *,
    proxies: int,
    origin_port: int,
    timeout: float,
    idle_window: float = 2.0,
) -> Measured:
    api_port, metrics_port = free_port(), free_port()
    argv = service_argv(name, server.url, metrics_port, *flags(name, tmp, api_port, origin_port))
    signal = caught_up_signal(name, conn, proxies, api_port, metrics_port)
    before = await last_seq(conn)
    note = ""
    async with running(name, argv, tmp / f"rss-{name}.log") as child:
        caught_up = await wait_for(child, signal, timeout)
        share = 0.0 if name == "health" else await idle(child.pid, window=idle_window, limit=60.0)
        mem = memory(child.pid)
        cpu = cpu_seconds(child.pid)
        load = load1()
        if name == "health":
            text = await scrape(metrics_port)
            ok = metric(text, "egress_health_probes_total", result="ok")
            total = metric(text, "egress_health_probes_total")
            note = f"probing, never idle; {ok:.0f} of {total:.0f} probes ok"
    return Measured(
        service=name,
        rss_mb=mem.get("VmRSS", 0.0),
        peak_mb=mem.get("VmHWM", 0.0),
        caught_up_s=caught_up,
        cpu_s=cpu,
        appended=await last_seq(conn) - before,
        idle_share=round(share, 3),
        load=load,
        note=note,
    )


async def wait_for(child: Child, signal: Signal, timeout: float) -> float:
    deadline = time.perf_counter() + timeout
    while True:
        child.check_alive()
        if await signal():
            return time.perf_counter() - child.started
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{child.name} did not catch up in {timeout:.0f} s; see {child.log}")
        await asyncio.sleep(0.1)


async def measure(
    tmp: Path,
    *,
    proxies: int,
    health_interval: float,
    timeout: float,
    services: tuple[str, ...] = SERVICES,
    say: Callable[[str], None] = print,
    idle_window: float = 2.0,
) -> RssReport:
    origin_port = free_port()
    proxy_spec = spec(health_interval)

    def fleet() -> Iterator[History]:
        for i in range(proxies):
            uid = proxy_uid(i)
            yield ready_history(uid, f"http://127.0.0.1:{origin_port}/{uid}", proxy_spec)

    data = tmp / "rss"
    fill = await fill_store(data, lambda conn: publish_fleet(conn.js, fleet()))
    say(f"rss: filled {proxies:,} proxies ({fill.events:,} events) in {fill.seconds:,.1f} s")
    report = RssReport(proxies, fill, health_interval)
    origin_argv = [sys.executable, "-m", "bench.scale_worker", "origin", str(origin_port)]
    origin = await spawn("origin", origin_argv, tmp / "origin.log")
    try:
        await listening(origin, origin_port, 30.0)
        async with product_server(data) as (server, conn):
            for name in services:
                m = await measure_service(
                    name,
                    server,
                    conn,
                    tmp,
                    proxies=proxies,
                    origin_port=origin_port,
                    timeout=timeout,
                    idle_window=idle_window,
                )
                report.measured.append(m)
                say(
                    f"  {name}: {m.rss_mb:.0f} MB resident (peak {m.peak_mb:.0f} MB), caught up "
                    f"in {m.caught_up_s:.1f} s, appended {m.appended} (load {m.load})"
                )
    finally:
        await origin.stop()
    return report
