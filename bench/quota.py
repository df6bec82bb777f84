"""What D135's quota costs an acquire: a limited client's claims go one at a time on a replica,
each after reading the lease stream's end (``services.discovery.leasing.quota``).

One nats-server and one discovery replica in this process, ``--proxies`` Ready proxies appended
straight to the log, and ``--concurrency`` tasks each doing acquire-then-release cycles over
HTTP for ``--seconds``, as two clients in turn: ``open`` (no ``maxLeases``: nothing of the
quota runs) and ``limited`` (``maxLeases`` above the concurrency: never refused, but every claim
serialised and preceded by a stream read). Reports cycles a second and the median and p99 of the
acquire's latency for each; run it on the code before the change for the "before" figures.

Run: ``python -m bench.quota [--proxies 64] [--concurrency 12] [--seconds 10] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from events import subjects
from events.schemas import Condition, HealthChanged, Phase, PhaseChanged, ProxyDeclared, ProxySpec
from events.store import NewEvent
from services.discovery.service import DiscoveryService
from services.runtime.clients import Clients
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import connect
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.metrics import Metrics
from services.runtime.pure.clients import hash_token
from services.runtime.service import ServiceContext
from services.runtime.settings.shared import Settings

TOKENS = {"open": "p" * 40, "limited": "l" * 40}


async def _proxies(store: JetStreamEventStore, count: int) -> None:
    for i in range(count):
        uid = f"q{i}"
        events = [
            NewEvent(
                ProxyDeclared(uid=uid, namespace="b", name=uid, spec=ProxySpec(provider="local")),
                f"d-{uid}",
            ),
            NewEvent(
                PhaseChanged(
                    phase=Phase.READY,
                    reason="InstanceRunning",
                    ip="127.0.0.1",
                    url="http://127.0.0.1:3128",
                    conditions=(Condition(type="Ready", status="True", reason="Running"),),
                ),
                f"r-{uid}",
            ),
            NewEvent(HealthChanged(healthy=True, reason="Probe", latency_ms=1.0), f"h-{uid}"),
        ]
        await store.append(subjects.proxy(uid), events)


async def _cycles(base: str, name: str, concurrency: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    cycles = 0
    stop = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {TOKENS[name]}"}

    async def worker(n: int) -> None:
        nonlocal cycles
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as http:
            while time.monotonic() < stop:
                started = time.perf_counter()
                got = await http.post("/v1/leases", json={"selector": {}, "holder": f"w{n}"})
                latencies.append(time.perf_counter() - started)
                if got.status_code != 201:
                    raise RuntimeError(f"{name}: {got.status_code} {got.text}")
                await http.delete(f"/v1/leases/{got.json()['id']}")
                cycles += 1

    began = time.monotonic()
    await asyncio.gather(*(worker(n) for n in range(concurrency)))
    elapsed = time.monotonic() - began
    latencies.sort()
    return {
        "cycles_per_s": round(cycles / elapsed, 1),
        "acquire_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "acquire_p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 2),
    }


async def run(proxies: int, concurrency: int, seconds: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        clients = Path(tmp) / "clients.yaml"
        clients.write_text(
            "clients:\n"
            f"  - {{name: open, token: '{hash_token(TOKENS['open'])}', scopes: [lease]}}\n"
            f"  - {{name: limited, token: '{hash_token(TOKENS['limited'])}', scopes: [lease],"
            f" maxLeases: {concurrency * 10}}}\n"
        )
        server = EmbeddedNatsServer(data_dir=Path(tmp) / "nats")
        await server.start()
        conn = await connect(server.url)
        try:
            await ensure_streams(conn.js)
            await _proxies(JetStreamEventStore(conn.nc, conn.js), proxies)
            service = DiscoveryService(
                port=0, lease_cooldown=0.0, clients=Clients(clients), shutdown_timeout=1.0
            )
            ctx = ServiceContext(
                settings=Settings(nats_url=server.url),
                conn=conn,
                store=JetStreamEventStore(conn.nc, conn.js),
                metrics=Metrics(),
            )
            task = asyncio.create_task(service.run(ctx))
            await asyncio.wait_for(service.listening.wait(), 30)
            base = f"http://127.0.0.1:{service.bound_port}"
            runs: dict[str, list[dict[str, float]]] = {"open": [], "limited": []}
            for name in ("open", "limited", "open", "limited"):
                runs[name].append(await _cycles(base, name, concurrency, seconds))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return {"proxies": proxies, "concurrency": concurrency, **runs}
        finally:
            await conn.close()
            await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxies", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures = asyncio.run(run(args.proxies, args.concurrency, args.seconds))
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
