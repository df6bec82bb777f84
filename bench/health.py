"""Health probing cost: N Ready proxies (local fake targets) probed at 1 Hz by one replica.

Three OS processes, so the figure is the prober's alone: a nats-server, a fake fleet (one asyncio
process listening on N ports, each answering like a proxy that reached its target: an absolute-URI
GET gets ``204`` on a keep-alive connection), and the health replica, started the way a
deployment starts it (``run_services``, metrics endpoint on). The proxies are written into the
log as Ready, as the reconciler would; the replica reaches a first verdict for every one, then
the CPU time of its process is read from ``/proc`` over the measured window, together with the
probes it reports on ``/metrics`` and the events appended meanwhile (there should be none: a
steady fleet is not news).

With ``--egress-interval S`` the replica also checks every proxy's egress every S seconds (D111):
the fake proxies answer the echo URL with an address of their own, placed with the data
geoip2fast ships, and the figures add the egress checks made and the findings appended.

Run: ``python -m bench.health [--proxies 1000] [--seconds 30] [--egress-interval S] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from nats.js import JetStreamContext

from events import subjects
from events.schemas import HealthCheck, Phase, PhaseChanged, ProxyDeclared, ProxySpec
from events.store import NewEvent, derive_msg_id
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import connect
from services.runtime.nats.server import EmbeddedNatsServer

CPU_TARGET = 0.5
_TICKS = os.sysconf("SC_CLK_TCK")
_ANSWER = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"
ECHO_URL = "http://echo.invalid/egress"


# --------------------------------------------------------------------------- the fake fleet


async def serve_fleet(count: int) -> None:
    """Listen on ``count`` ports; print them as one JSON line; answer every request with 204."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = writer.get_extra_info("sockname")[1]
        echo = f"5.9.{port % 250}.{port % 7 + 1}\n".encode()  # a public address per proxy
        answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET " + ECHO_URL.encode()):
                    writer.write(answer % (len(echo), echo))
                else:
                    writer.write(_ANSWER)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    servers = [await asyncio.start_server(handle, "127.0.0.1", 0) for _ in range(count)]
    print(json.dumps([s.sockets[0].getsockname()[1] for s in servers]), flush=True)
    await asyncio.Event().wait()


# --------------------------------------------------------------------------- the replica


def run_replica(nats_url: str, metrics_port: int, egress_interval: float = 0.0) -> None:
    from services.health.service import HealthService  # noqa: PLC0415 - worker mode only
    from services.runtime.observability.logs import configure_logging  # noqa: PLC0415
    from services.runtime.service import run_services  # noqa: PLC0415
    from services.runtime.settings.shared import Settings  # noqa: PLC0415

    configure_logging("warning", "console")
    settings = Settings(nats_url=nats_url, metrics_port=metrics_port, service_name="bench-health")
    from services.health.egress import EgressSettings  # noqa: PLC0415

    egress = (
        EgressSettings(echo_url=ECHO_URL, interval=egress_interval) if egress_interval else None
    )
    service = HealthService(
        check_url="http://check.invalid/generate_204", heartbeat=1.0, egress=egress
    )
    asyncio.run(run_services([service], settings))


# --------------------------------------------------------------------------- the driver


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^(egress_health_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if match:
            key = match.group(1) + (match.group(2) or "")
            out[key] = out.get(key, 0.0) + float(match.group(3))
    return out


def probes_total(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("egress_health_probes_total{"))


async def seed(store: JetStreamEventStore, ports: list[int]) -> None:
    check = HealthCheck(url="", interval_seconds=1.0, timeout_seconds=2.0)
    for i, port in enumerate(ports):
        uid = f"bench-{i:05d}"
        events = [
            ProxyDeclared(uid=uid, namespace="bench", name=uid, spec=ProxySpec(health_check=check)),
            PhaseChanged(
                phase=Phase.READY, url=f"http://127.0.0.1:{port}", provider_id=f"inst-{i}"
            ),
        ]
        news = [NewEvent(e, derive_msg_id("bench", uid, str(n))) for n, e in enumerate(events)]
        await store.append(subjects.proxy(uid), news, expected_seq=0)


async def health_events(js: JetStreamContext, category: str = "health") -> int:
    info = await js.stream_info(subjects.PROXY_STREAM, subjects_filter=f"proxy.*.{category}")
    return sum((info.state.subjects or {}).values())


async def bench(
    count: int, seconds: float, metrics_port: int, egress_interval: float = 0.0
) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNatsServer(data_dir=Path(tmp) / "nats")
        await server.start()
        fleet = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.health", "--serve-fleet", str(count),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        replica: asyncio.subprocess.Process | None = None
        try:
            assert fleet.stdout is not None
            ports = json.loads(await fleet.stdout.readline())
            conn = await connect(server.url)
            await ensure_streams(conn.js)
            store = JetStreamEventStore(conn.nc, conn.js)
            await seed(store, ports)
            replica = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.health", "--run-replica", server.url,
                "--metrics-port", str(metrics_port), "--egress-interval", str(egress_interval),
            )  # fmt: skip
            started = time.monotonic()
            while await health_events(conn.js) < count:
                if time.monotonic() - started > 120:
                    raise RuntimeError("no first verdict for every proxy within 120 s")
                await asyncio.sleep(0.5)
            first_verdicts = time.monotonic() - started
            while egress_interval and await health_events(conn.js, "egress") < count:
                if time.monotonic() - started > 180:
                    raise RuntimeError("no egress finding for every proxy within 180 s")
                await asyncio.sleep(0.5)
            await asyncio.sleep(5.0)  # settle: every probe task past its first round
            events_before = await health_events(conn.js)
            egress_before = await health_events(conn.js, "egress")
            before, cpu0, t0 = scrape(metrics_port), cpu_seconds(replica.pid), time.monotonic()
            await asyncio.sleep(seconds)
            after, cpu1, t1 = scrape(metrics_port), cpu_seconds(replica.pid), time.monotonic()
            events_after = await health_events(conn.js)
            egress_after = await health_events(conn.js, "egress")
            await conn.close()
        finally:
            for proc in (replica, fleet):
                if proc is not None and proc.returncode is None:
                    proc.terminate()
                    await proc.wait()
            await server.stop()
    elapsed = t1 - t0
    probes = probes_total(after) - probes_total(before)
    return {
        "proxies": count,
        "window_seconds": round(elapsed, 1),
        "first_verdicts_seconds": round(first_verdicts, 1),
        "cpu_cores": round((cpu1 - cpu0) / elapsed, 3),
        "probes_per_second": round(probes / elapsed, 1),
        "cpu_us_per_probe": round((cpu1 - cpu0) / probes * 1e6, 1) if probes else None,
        "failed_probes": probes
        - (
            after.get('egress_health_probes_total{result="ok"}', 0.0)
            - before.get('egress_health_probes_total{result="ok"}', 0.0)
        ),
        "oldest_probe_age_seconds": after.get("egress_health_last_probe_age_seconds", -1.0),
        "events_in_window": events_after - events_before,
        "egress_interval_seconds": egress_interval,
        "egress_checks_per_second": round(
            (egress_checks(after) - egress_checks(before)) / elapsed, 2
        ),
        "egress_findings_in_window": egress_after - egress_before,
        "cpu_target_cores": CPU_TARGET,
        "loadavg": os.getloadavg()[0],
    }


def egress_checks(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("egress_health_egress_checks_total{"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--proxies", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--metrics-port", type=int, default=19464)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--egress-interval", type=float, default=0.0)
    parser.add_argument("--serve-fleet", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run-replica", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fleet:
        asyncio.run(serve_fleet(args.serve_fleet))
        return
    if args.run_replica:
        run_replica(args.run_replica, args.metrics_port, args.egress_interval)
        return
    result = asyncio.run(bench(args.proxies, args.seconds, args.metrics_port, args.egress_interval))
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
