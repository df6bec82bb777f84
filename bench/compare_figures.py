"""What `bench compare` reads from each benchmark's JSON and how it judges a change
(docs/benchmarks.md, "Comparing with the last landing"). Pure: no processes, no files.

Each hot path's benchmark names its headline figures by where they sit in its ``--json``
document and which way is better. A figure that moved the wrong way by more than ``THRESHOLD``
of the base's value is a regression; the closing note of a submission names every one.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

THRESHOLD = 0.10
"""A change this large (a fraction of the base's figure), the wrong way, is a regression."""

Better = Literal["lower", "higher"]


@dataclass(frozen=True, slots=True)
class Figure:
    label: str
    path: tuple[str | int, ...]
    """Keys and list indexes into the benchmark's JSON."""
    better: Better


@dataclass(frozen=True, slots=True)
class Bench:
    name: str
    module: str
    arguments: tuple[str, ...]
    """A run short enough to alternate several times within a session, long enough to settle."""
    quick: tuple[str, ...]
    """The smallest run that still reports every figure (a smoke test, not a measurement)."""
    figures: tuple[Figure, ...]


def _cpu_per_proxy(doc: Mapping[str, Any]) -> float:
    """Lifecycle: every process's CPU per proxy, ms, one reconciler."""
    cpu = doc["summary"]["k1"]["cpu_seconds"]
    proxies = int(doc["config"]["proxies"])
    return 1000 * sum(float(v) for v in cpu.values()) / proxies


BENCHES: tuple[Bench, ...] = (
    Bench(
        "discovery",
        "bench.discovery",
        ("--phases", "leases", "--seconds", "8", "--rounds", "1", "--race-rounds", "0"),
        (
            "--phases",
            "leases",
            "--seconds",
            "2",
            "--rounds",
            "1",
            "--race-rounds",
            "0",
            "--clients",
            "4",
            "--proxies",
            "8",
        ),
        (
            Figure("API CPU µs per lease cycle", ("summary", "lease API CPU us/cycle", 0), "lower"),
            Figure("lease cycles/s", ("summary", "cycles/s", 0), "higher"),
        ),
    ),
    Bench(
        "lifecycle",
        "bench.lifecycle",
        ("--proxies", "1000", "--rounds", "1", "--replicas", "1"),
        ("--proxies", "40", "--rounds", "1", "--replicas", "1"),
        (
            Figure("CPU ms per proxy to Ready", ("cpu_per_proxy",), "lower"),
            Figure("seconds to all Ready", ("summary", "k1", "seconds", 0), "lower"),
        ),
    ),
    Bench(
        "eventlog",
        "bench.eventlog",
        ("--events", "20000", "--rounds", "1"),
        ("--events", "2000", "--rounds", "1", "--uids", "100"),
        (
            Figure("append CPU µs per event", ("summary", "append", "ours_cpu_us", 0), "lower"),
            Figure("append events/s", ("summary", "append", "ours_rate", 0), "higher"),
            Figure("rebuild events/s", ("summary", "rebuild", "ours_rate", 0), "higher"),
        ),
    ),
    Bench(
        "health",
        "bench.health",
        ("--proxies", "1000", "--seconds", "20"),
        ("--proxies", "40", "--seconds", "5"),
        (
            Figure("CPU µs per probe", ("cpu_us_per_probe",), "lower"),
            Figure("probes/s", ("probes_per_second",), "higher"),
        ),
    ),
)
BY_NAME = {b.name: b for b in BENCHES}
DERIVED = {"cpu_per_proxy": _cpu_per_proxy}
"""Figures computed from a document rather than read from one place in it."""


def read(doc: Mapping[str, Any], figure: Figure) -> float | None:
    """The figure's value in ``doc``, or None when the document has no such figure (a base
    whose benchmark did not report it yet, a run that failed part-way)."""
    head = figure.path[0]
    if isinstance(head, str) and head in DERIVED and len(figure.path) == 1:
        try:
            return DERIVED[head](doc)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None
    node: Any = doc
    for step in figure.path:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            return None
    if isinstance(node, bool) or not isinstance(node, int | float):
        return None
    return float(node)


@dataclass(frozen=True, slots=True)
class Verdict:
    bench: str
    figure: str
    better: Better
    base: list[float]
    head: list[float]

    @property
    def change(self) -> float | None:
        """The head's median against the base's, as a signed fraction of the base's."""
        if not self.base or not self.head:
            return None
        base = statistics.median(self.base)
        if base == 0:
            return None
        return statistics.median(self.head) / base - 1

    @property
    def regression(self) -> bool:
        change = self.change
        if change is None:
            return False
        worse = change if self.better == "lower" else -change
        return worse > THRESHOLD


def judge(
    bench: Bench, base: Sequence[Mapping[str, Any]], head: Sequence[Mapping[str, Any]]
) -> list[Verdict]:
    """One verdict per figure over the rounds of each arm."""
    verdicts = []
    for figure in bench.figures:
        base_values = [v for doc in base if (v := read(doc, figure)) is not None]
        head_values = [v for doc in head if (v := read(doc, figure)) is not None]
        verdicts.append(Verdict(bench.name, figure.label, figure.better, base_values, head_values))
    return verdicts
