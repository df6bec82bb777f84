"""One nats-server against a three-node cluster, in the same run: appends/s and lease cycles/s.

Both targets run the product configuration (file storage, ``sync_interval: always``, a user per
service). The single server holds the streams with 1 replica, the cluster (three nodes on
loopback, tests/support/natscluster.py) with 3, as `streams init --replicas 3` creates them. On
each target, in turn:

- **appends/s**: ``JetStreamEventStore.append`` with the optimistic-concurrency check, as the
  services append (bench/eventlog.py's ``append_ours``), ``--events`` events over ``--uids``
  aggregates by ``--concurrency`` writers;
- **lease cycles/s**: a discovery service in this process, on its own NATS connection to the
  target (every server of the cluster in its URL list), ``--clients`` HTTP clients each
  acquiring and releasing back to back for ``--seconds`` over ``--proxies`` Ready proxies. A
  cycle is an acquire answered 201 and a release answered 204; anything else is an error.

Each round alternates which target goes first; the table shows the median over the rounds.

Run: ``python -m bench.cluster [--rounds 3] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.discovery_worker import HttpConnection
from bench.eventlog import append_ours
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import connect
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.logs import configure_logging
from tests.support.discovery import discovery, ready_proxy
from tests.support.natscluster import running_cluster

TARGETS = ("single", "cluster")


@dataclass
class Figures:
    target: str
    appends: int = 0
    append_seconds: float = 0.0
    cycles: int = 0
    cycle_seconds: float = 0.0
    errors: Counter[int] = field(default_factory=Counter)

    @property
    def appends_per_s(self) -> float:
        return self.appends / self.append_seconds if self.append_seconds else 0.0

    @property
    def cycles_per_s(self) -> float:
        return self.cycles / self.cycle_seconds if self.cycle_seconds else 0.0


@dataclass(frozen=True, slots=True)
class Options:
    events: int = 5000
    uids: int = 500
    concurrency: int = 32
    proxies: int = 50
    clients: int = 8
    seconds: float = 5.0
    rounds: int = 3


@asynccontextmanager
async def targets(tmp: Path) -> AsyncIterator[dict[str, str]]:
    """Both targets, streams created: their URLs by name."""
    single = EmbeddedNatsServer(data_dir=tmp / "single")
    await single.start()
    try:
        async with running_cluster(tmp / "cluster") as cluster:
            for url, replicas in ((single.url, 1), (cluster.url, 3)):
                conn = await connect(url)
                try:
                    await ensure_streams(conn.js, replicas)
                finally:
                    await conn.close()
            yield {"single": single.url, "cluster": cluster.url}
    finally:
        await single.stop()


async def cycles(port: int, clients: int, seconds: float, figures: Figures) -> None:
    conns = [await HttpConnection.open(port) for _ in range(clients)]

    async def client(i: int, http: HttpConnection) -> None:
        while time.perf_counter() < deadline:
            body = {"ttlSeconds": 60, "holder": f"bench-{i}"}
            status, _, raw = await http.request("POST", "/v1/leases", body)
            if status != 201:
                figures.errors[status] += 1
                continue
            status = (await http.request("DELETE", f"/v1/leases/{json.loads(raw)['id']}"))[0]
            if status != 204:
                figures.errors[status] += 1
                continue
            figures.cycles += 1

    started = time.perf_counter()
    deadline = started + seconds
    try:
        await asyncio.gather(*(client(i, c) for i, c in enumerate(conns)))
    finally:
        figures.cycle_seconds = time.perf_counter() - started
        for http in conns:
            await http.close()


async def measure_one(url: str, name: str, round_no: int, options: Options) -> Figures:
    figures = Figures(name)
    conn = await connect(url)
    try:
        store = JetStreamEventStore(conn.nc, conn.js)
        run = await append_ours(
            store, f"{name}-r{round_no}", options.events, options.uids, options.concurrency
        )
        figures.appends, figures.append_seconds = run.events, run.seconds
        async with discovery(url, lease_cooldown=0.0) as (_, base):
            for i in range(options.proxies):
                await ready_proxy(store, f"{name}-r{round_no}-px{i}", {"bench": f"r{round_no}"})
            port = int(base.rsplit(":", 1)[1])
            await cycles(port, options.clients, options.seconds, figures)
    finally:
        await conn.close()
    return figures


async def measure(tmp: Path, options: Options) -> list[dict[str, Figures]]:
    out: list[dict[str, Figures]] = []
    async with targets(tmp) as urls:
        for r in range(options.rounds):
            order = TARGETS if r % 2 == 0 else tuple(reversed(TARGETS))
            got = {name: await measure_one(urls[name], name, r, options) for name in order}
            out.append({name: got[name] for name in TARGETS})
    return out


def summary(rounds: list[dict[str, Figures]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name in TARGETS:
        out[name] = {
            "appends_per_s": statistics.median(r[name].appends_per_s for r in rounds),
            "cycles_per_s": statistics.median(r[name].cycles_per_s for r in rounds),
            "errors": float(sum(sum(r[name].errors.values()) for r in rounds)),
        }
    return out


def render(figures: dict[str, dict[str, float]], console: Console) -> None:
    table = Table(title="one nats-server vs a three-node cluster (median over rounds)")
    for column in ("target", "appends/s", "lease cycles/s", "errors"):
        table.add_column(column, justify="left" if column == "target" else "right")
    for name in TARGETS:
        f = figures[name]
        table.add_row(
            name, f"{f['appends_per_s']:,.0f}", f"{f['cycles_per_s']:,.0f}", f"{f['errors']:.0f}"
        )
    single, cluster = figures["single"], figures["cluster"]
    if single["appends_per_s"] and single["cycles_per_s"]:
        table.add_row(
            "cluster / single",
            f"{cluster['appends_per_s'] / single['appends_per_s']:.2f}",
            f"{cluster['cycles_per_s'] / single['cycles_per_s']:.2f}",
            "",
        )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = Options()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name}", type=type(value), default=value)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    options = Options(**{k: getattr(args, k) for k in asdict(defaults)})
    configure_logging("warning", "console")
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        rounds = asyncio.run(measure(Path(tmp), options))
    figures = summary(rounds)
    render(figures, Console())
    if args.json:
        doc = {"options": asdict(options), "python": platform.python_version(), **figures}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
