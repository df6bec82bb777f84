"""Discovery API throughput and exclusivity, over real HTTP against the API as its own process.

Throughput: 32 clients run acquire+release cycles, and the same clients on the same connections
ask the same server for ``GET /healthz``. Targets: lease requests/s >= 0.5x healthz requests/s,
and a cycle p99 <= 25 ms. Healthz is what the HTTP stack, the framework and the client cost with
no lease work at all, so the ratio isolates what leasing costs (two fsync'd JetStream appends
and two reads of them per cycle). Which phase goes first alternates by round, because on a
shared machine the load drifts within a run; the API's CPU per request is reported too, as it
barely moves with the machine's load. A third, paced phase runs cycles at a fixed rate well
under saturation: with 32 clients always waiting, latency is mostly queueing (Little's law),
and the paced figure is the latency a crawler sees when the API is not overloaded.

Race (``bench.discovery_race``): two API processes, 64 clients, one proxy; double leases must
be 0.

Run: ``python -m bench.discovery [--seconds S] [--rounds R] [--json FILE]``.
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
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.discovery_race import Race, race
from bench.discovery_worker import HttpConnection, setup
from bench.lifecycle_worker import cpu_seconds
from services.runtime.logs import configure_logging

RATIO_TARGET = 0.5
P99_TARGET_MS = 25.0
PHASES = ("healthz", "leases", "paced")


@dataclass
class Load:
    """One phase of one round: what every client did until the deadline."""

    name: str
    seconds: float = 0.0
    requests: int = 0
    cycles: int = 0
    latency_ms: list[float] = field(default_factory=list)
    """Per request (healthz) or per acquire+release cycle (leases, paced)."""
    errors: Counter[int] = field(default_factory=Counter)
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def api_us(self) -> float:
        """The API process's CPU per request."""
        return 1e6 * self.cpu.get("api", 0.0) / self.requests if self.requests else 0.0


def pct(values: list[float], q: int) -> float:
    """The q-th percentile (inclusive method); 0 with no values."""
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def cycle(http: HttpConnection, load: Load, holder: str) -> None:
    started = time.perf_counter()
    status, _, body = await http.request("POST", "/v1/leases", {"ttlSeconds": 60, "holder": holder})
    load.requests += 1
    if status != 201:
        load.errors[status] += 1
        return
    status = (await http.request("DELETE", f"/v1/leases/{json.loads(body)['id']}"))[0]
    load.requests += 1
    if status != 204:
        load.errors[status] += 1
        return
    load.cycles += 1
    load.latency_ms.append(1000 * (time.perf_counter() - started))


async def healthz(http: HttpConnection, load: Load, _: str) -> None:
    started = time.perf_counter()
    status = (await http.request("GET", "/healthz"))[0]
    load.requests += 1
    if status != 200:
        load.errors[status] += 1
        return
    load.latency_ms.append(1000 * (time.perf_counter() - started))


async def drive(
    conns: list[HttpConnection],
    name: str,
    seconds: float,
    pids: dict[str, int],
    *,
    pace: float = 0.0,
) -> Load:
    """Every client repeats its operation until the deadline, back to back, or with ``pace``
    (cycles/s over all clients) at that rate; the clock stops with the last answer."""
    load = Load(name)
    work = healthz if name == "healthz" else cycle
    cpu0 = {who: cpu_seconds(pid) for who, pid in pids.items()}
    bench0, started = time.process_time(), time.perf_counter()
    deadline = started + seconds
    interval = len(conns) / pace if pace else 0.0

    async def client(i: int, http: HttpConnection) -> None:
        due = started + interval * i / len(conns)  # spread out, not all at once
        while time.perf_counter() < deadline:
            if interval:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                due += interval
            await work(http, load, f"crawler-{i}")

    await asyncio.gather(*(client(i, c) for i, c in enumerate(conns)))
    load.seconds = time.perf_counter() - started
    load.cpu = {who: cpu_seconds(pid) - cpu0[who] for who, pid in pids.items()}
    load.cpu["bench"] = time.process_time() - bench0
    return load


async def throughput(
    tmp: Path,
    *,
    clients: int,
    proxies: int,
    seconds: float,
    rounds: int,
    pace: float,
    profile: Path | None = None,
) -> list[dict[str, Load]]:
    """Rounds of the phases on one server, one API process and one set of connections."""
    async with setup(tmp, proxies=proxies, apis=1, profile=profile) as running:
        conns = [await HttpConnection.open(running.apis[0].port) for _ in range(clients)]
        try:
            pids = running.pids()
            await drive(conns, "leases", min(seconds, 1.0), pids)  # warm-up, not counted
            out: list[dict[str, Load]] = []
            for r in range(rounds):
                order = PHASES if r % 2 == 0 else tuple(reversed(PHASES))
                out.append(
                    {
                        name: await drive(conns, name, seconds, pids, pace=pace * (name == "paced"))
                        for name in order
                    }
                )
            return out
        finally:
            for http in conns:
                await http.close()


# ------------------------------------------------------------------------------- reporting


def spread(values: list[float]) -> list[float]:
    return [statistics.median(values), min(values), max(values)] if values else [0.0] * 3


def summarise(rounds: list[dict[str, Load]]) -> dict[str, list[float]]:
    """Median (min, max) over rounds; ratios are taken within a round, under one load."""

    def each(f: str, fig: str) -> list[float]:
        return spread([float(getattr(r[f], fig)) for r in rounds])

    def lat(f: str, q: int) -> list[float]:
        return spread([pct(r[f].latency_ms, q) for r in rounds])

    return {
        "healthz req/s": each("healthz", "rate"),
        "lease req/s": each("leases", "rate"),
        "cycles/s": spread([r["leases"].cycles / r["leases"].seconds for r in rounds]),
        "ratio lease/healthz req/s": spread(
            [r["leases"].rate / r["healthz"].rate for r in rounds if r["healthz"].rate]
        ),
        "healthz API CPU us/req": each("healthz", "api_us"),
        "lease API CPU us/req": each("leases", "api_us"),
        "ratio by CPU": spread([r["healthz"].api_us / r["leases"].api_us for r in rounds]),
        "healthz p50 ms": lat("healthz", 50),
        "healthz p99 ms": lat("healthz", 99),
        "cycle p50 ms": lat("leases", 50),
        "cycle p99 ms": lat("leases", 99),
        "paced cycles/s": spread([r["paced"].cycles / r["paced"].seconds for r in rounds]),
        "paced cycle p50 ms": lat("paced", 50),
        "paced cycle p99 ms": lat("paced", 99),
        "errors": [float(sum(sum(x.errors.values()) for r in rounds for x in r.values()))] * 3,
    }


def verdicts(summary: dict[str, list[float]]) -> dict[str, bool]:
    return {
        "ratio": summary["ratio lease/healthz req/s"][0] >= RATIO_TARGET,
        "cycle_p99": summary["cycle p99 ms"][0] <= P99_TARGET_MS,
    }


def render(summary: dict[str, list[float]], races: list[Race], console: Console) -> None:
    if summary:
        table = Table(title="discovery API: median (min-max) over rounds")
        for column in ("", "median", "min", "max"):
            table.add_column(column, justify="right" if column else "left")
        for key, values in summary.items():
            table.add_row(key, *(f"{v:,.2f}" if v < 100 else f"{v:,.0f}" for v in values))
        console.print(table)
        met = verdicts(summary)
        console.print(
            f"target lease/healthz >= {RATIO_TARGET}: {'met' if met['ratio'] else 'NOT met'}; "
            f"cycle p99 <= {P99_TARGET_MS} ms: {'met' if met['cycle_p99'] else 'NOT met'}"
        )
    for r in races:
        console.print(
            f"race, {r.replicas} APIs, {r.clients} clients, 1 proxy: {r.grants} grants "
            f"{r.grants_by_replica} in {r.attempts} attempts ({r.busy} busy), "
            f"{r.conflicts:.0f} conflicts; double leases: {r.doubles} (clients), "
            f"{r.log_overlaps} (log); fold granted {r.log_granted}, refused {r.log_rejected}; "
            f"tokens in order: {r.tokens_in_order}; {r.seconds:.1f} s"
        )


async def _main(args: argparse.Namespace) -> dict[str, object]:
    configure_logging("error")
    rounds: list[dict[str, Load]] = []
    races: list[Race] = []
    with tempfile.TemporaryDirectory(prefix="bench-discovery-") as tmp:
        if args.rounds:
            rounds = await throughput(
                Path(tmp) / "throughput",
                clients=args.clients,
                proxies=args.proxies,
                seconds=args.seconds,
                rounds=args.rounds,
                pace=args.pace,
                profile=args.profile,
            )
        for n in range(args.race_rounds):
            races.append(await race(Path(tmp) / f"race-{n}", grants=args.race_grants))
    summary = summarise(rounds) if rounds else {}
    render(summary, races, Console())
    return {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "summary": summary,
        "targets": verdicts(summary) if summary else {},
        "rounds": [
            {k: {**asdict(x), "latency_ms": None, "rate": x.rate} for k, x in r.items()}
            for r in rounds
        ],
        "races": [asdict(r) for r in races],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.discovery", description=__doc__)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--proxies", type=int, default=64, help="more than --clients: no 503s")
    parser.add_argument("--seconds", type=float, default=5.0, help="per phase per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pace", type=float, default=100.0, help="cycles/s of the paced phase")
    parser.add_argument("--race-rounds", type=int, default=1)
    parser.add_argument("--race-grants", type=int, default=300)
    parser.add_argument("--profile", type=Path, help="cProfile stats file for the API process")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    doc = asyncio.run(_main(args))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
