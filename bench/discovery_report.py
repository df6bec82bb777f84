"""The discovery benchmark's figures: one phase's load, the summary over rounds, the targets.

Kept apart from the driving code (``bench.discovery``) so that what is reported, and how the
targets are judged, reads in one place (docs/benchmarks.md, "Discovery API").
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from rich.console import Console
from rich.table import Table

from bench.discovery_race import Race

RATIO_TARGET = 0.7
PACED_P99_TARGET_MS = 5.0
API_CPU_PROPOSED_US = 1600.0
"""The proposed replacement of the ratio target: API CPU per cycle at 32 clients
(docs/benchmarks.md, "Discovery API")."""
PACED_P99_PROPOSED_MS = 50.0
"""The proposed paced p99 on 2 shared cores (the 5 ms target needs a core per process)."""


@dataclass
class Load:
    """One phase of one round: what every client did until the deadline."""

    name: str
    seconds: float = 0.0
    requests: int = 0
    """HTTP requests (healthz, leases, paced) or acknowledged appends (raw)."""
    cycles: int = 0
    pace: float = 0.0
    """The rate asked for (cycles/s over all clients), paced phase only; 0: back to back."""
    latency_ms: list[float] = field(default_factory=list)
    """Per request (healthz), per acquire+release cycle (leases, paced), per append (raw)."""
    errors: Counter[str] = field(default_factory=Counter)
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Requests (or appends) per second."""
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def cycle_rate(self) -> float:
        return self.cycles / self.seconds if self.seconds else 0.0

    def cpu_us(self, who: str, per: str = "request") -> float:
        """A process's CPU per request (or append), or per cycle."""
        n = self.cycles if per == "cycle" else self.requests
        return 1e6 * self.cpu.get(who, 0.0) / n if n else 0.0


def pct(values: list[float], q: int) -> float:
    """The q-th percentile (inclusive method); 0 with no values."""
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def ratio(loads: dict[str, Load]) -> float:
    """Lease cycles/s ÷ (raw appends/s ÷ 2): a cycle is two appends."""
    raw = loads["raw"].rate
    return loads["leases"].cycle_rate / (raw / 2) if raw else 0.0


def spread(values: list[float]) -> list[float]:
    return [statistics.median(values), min(values), max(values)] if values else [0.0] * 3


def summarise(rounds: list[dict[str, Load]]) -> dict[str, list[float]]:
    """Median (min, max) over rounds; ratios are taken within a round, under one load. Figures
    of phases that did not run are left out."""

    def each(phase: str, figure: Callable[[Load], float]) -> list[float]:
        return spread([figure(r[phase]) for r in rounds if phase in r])

    def lat(phase: str, q: int) -> list[float]:
        return each(phase, lambda x: pct(x.latency_ms, q))

    ran = set.intersection(*(set(r) for r in rounds)) if rounds else set()
    out: dict[str, list[float]] = {}
    if "raw" in ran:
        out["raw appends/s"] = each("raw", lambda x: x.rate)
    if "leases" in ran:
        out["cycles/s"] = each("leases", lambda x: x.cycle_rate)
    if {"raw", "leases"} <= ran:
        out["ratio cycles/(raw/2)"] = spread([ratio(r) for r in rounds])
    if "paced" in ran:
        out["paced cycles/s"] = each("paced", lambda x: x.cycle_rate)
        out["paced cycle p50 ms"] = lat("paced", 50)
        out["paced cycle p99 ms"] = lat("paced", 99)
    if "raw" in ran:
        out["raw append p50 ms"] = lat("raw", 50)
        out["raw append p99 ms"] = lat("raw", 99)
    if "leases" in ran:
        out["cycle p50 ms (saturated)"] = lat("leases", 50)
        out["cycle p99 ms (saturated)"] = lat("leases", 99)
        out["lease API CPU us/cycle"] = each("leases", lambda x: x.cpu_us("api", "cycle"))
        out["lease nats-server CPU us/cycle"] = each(
            "leases", lambda x: x.cpu_us("nats-server", "cycle")
        )
        out["lease bench CPU us/cycle"] = each("leases", lambda x: x.cpu_us("bench", "cycle"))
    if "raw" in ran:
        out["raw nats-server CPU us/append"] = each("raw", lambda x: x.cpu_us("nats-server"))
        out["raw bench CPU us/append"] = each("raw", lambda x: x.cpu_us("bench"))
    if "paced" in ran:
        out["paced API CPU us/cycle"] = each("paced", lambda x: x.cpu_us("api", "cycle"))
    if "healthz" in ran:
        out["healthz req/s (info)"] = each("healthz", lambda x: x.rate)
        out["healthz API CPU us/req (info)"] = each("healthz", lambda x: x.cpu_us("api"))
        out["healthz p99 ms (info)"] = lat("healthz", 99)
    if {"healthz", "leases"} <= ran:
        out["lease/healthz req/s (info)"] = spread(
            [r["leases"].rate / r["healthz"].rate for r in rounds if r["healthz"].rate]
        )
    errors = sum(sum(x.errors.values()) for r in rounds for x in r.values())
    out["errors"] = [float(errors)] * 3
    return out


def verdicts(summary: dict[str, list[float]]) -> dict[str, bool]:
    """The targets whose figures were measured."""
    met: dict[str, bool] = {}
    if "ratio cycles/(raw/2)" in summary:
        met["ratio"] = summary["ratio cycles/(raw/2)"][0] >= RATIO_TARGET
    if "paced cycle p99 ms" in summary:
        met["paced_p99"] = summary["paced cycle p99 ms"][0] <= PACED_P99_TARGET_MS
        met["proposed_paced_p99"] = summary["paced cycle p99 ms"][0] <= PACED_P99_PROPOSED_MS
    if "lease API CPU us/cycle" in summary:
        met["proposed_api_cpu"] = summary["lease API CPU us/cycle"][0] <= API_CPU_PROPOSED_US
    return met


def render(
    summary: dict[str, list[float]],
    races: list[Race],
    console: Console,
    title: str = "discovery API: median (min-max) over rounds",
) -> None:
    if summary:
        table = Table(title=title)
        for column in ("", "median", "min", "max"):
            table.add_column(column, justify="right" if column else "left")
        for key, values in summary.items():
            table.add_row(key, *(f"{v:,.2f}" if v < 100 else f"{v:,.0f}" for v in values))
        console.print(table)
        met = verdicts(summary)
        words = {True: "met", False: "NOT met"}
        if "ratio" in met:
            console.print(
                f"target cycles/s >= {RATIO_TARGET} x (raw appends/s / 2): {words[met['ratio']]}"
            )
        if "paced_p99" in met:
            console.print(
                f"target paced cycle p99 <= {PACED_P99_TARGET_MS} ms: {words[met['paced_p99']]}"
            )
        if "proposed_api_cpu" in met:
            console.print(
                f"proposed: API CPU per cycle <= {API_CPU_PROPOSED_US:,.0f} us: "
                f"{words[met['proposed_api_cpu']]}"
            )
        if "proposed_paced_p99" in met:
            console.print(
                f"proposed: paced cycle p99 <= {PACED_P99_PROPOSED_MS} ms on shared cores: "
                f"{words[met['proposed_paced_p99']]}"
            )
    for r in races:
        console.print(
            f"race, {r.replicas} APIs, {r.clients} clients, 1 proxy: {r.grants} grants "
            f"{r.grants_by_replica} in {r.attempts} attempts ({r.busy} busy), "
            f"{r.conflicts:.0f} conflicts; double leases: {r.doubles} (clients), "
            f"{r.log_overlaps} (log); fold granted {r.log_granted}, refused {r.log_rejected}; "
            f"tokens in order: {r.tokens_in_order}; {r.seconds:.1f} s"
        )


def round_figures(loads: dict[str, Load]) -> dict[str, object]:
    out: dict[str, object] = {
        k: {
            **asdict(x),
            "latency_ms": None,
            "rate": x.rate,
            "cycle_rate": x.cycle_rate,
            "p50_ms": pct(x.latency_ms, 50),
            "p99_ms": pct(x.latency_ms, 99),
        }
        for k, x in loads.items()
    }
    if {"raw", "leases"} <= set(loads):
        out["ratio"] = ratio(loads)
    return out
