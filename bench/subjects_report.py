"""bench.subjects' figures: what each size measured, as tables and JSON (see bench/subjects.py)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.scale_fleet import load

READS = ("get", "multi_last", "read")
OPS = (*READS, *(f"{op} again" for op in READS), "append", "one", "four")


@dataclass
class Fill:
    proxies: int
    messages: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0
    rss_mb: float = 0.0


@dataclass
class Cost:
    op: str
    count: int
    """Operations done (for ``one``/``four``: messages delivered)."""
    ok: int
    """Operations that did what they claim (a read of 3 events, an append stored, ...)."""
    seconds: float
    cpu_us: float
    """Server CPU per operation from ``/proc/<pid>/stat`` (10 ms ticks)."""
    sched_us: float
    """The same from the threads' ``schedstat`` (nanoseconds)."""


@dataclass
class SizeReport:
    proxies: int
    fill: Fill
    subjects: int = 0
    store_mb: float = 0.0
    rss_empty_mb: float = 0.0
    rss_restart_mb: float = 0.0
    rss_after_reads_mb: float = 0.0
    """After the reads: the blocks they loaded are cached for a while."""
    rss_after_ops_mb: float = 0.0
    rss_idle_mb: float = 0.0
    """After ``idle`` seconds more without a request: whether the caches' memory goes back."""
    rss_crash_mb: float = 0.0
    ready_s: float = 0.0
    ready_after_kill_s: float = 0.0
    stored_after: int = 0
    append_proxies: int = 0
    """The proxies the M appends went to."""
    load1: float = 0.0
    costs: list[Cost] = field(default_factory=list)


def render(reports: list[SizeReport], console: Console) -> None:
    memory_table = Table(title="nats-server memory (RSS, MB) and restart, per size")
    columns: dict[str, Callable[[SizeReport], str]] = {
        "proxies": lambda r: f"{r.proxies:,}",
        "subjects": lambda r: f"{r.subjects:,}",
        "store MB": lambda r: f"{r.store_mb:,.0f}",
        "fill s": lambda r: f"{r.fill.seconds:,.0f}",
        "empty": lambda r: f"{r.rss_empty_mb:,.0f}",
        "filled": lambda r: f"{r.fill.rss_mb:,.0f}",
        "restarted": lambda r: f"{r.rss_restart_mb:,.0f}",
        "B/subject": lambda r: f"{2**20 * (r.rss_restart_mb - r.rss_empty_mb) / r.subjects:,.0f}",
        "after reads": lambda r: f"{r.rss_after_reads_mb:,.0f}",
        "after all": lambda r: f"{r.rss_after_ops_mb:,.0f}",
        "idle": lambda r: f"{r.rss_idle_mb:,.0f}",
        "ready s": lambda r: f"{r.ready_s:.2f}",
        "ready after kill s": lambda r: f"{r.ready_after_kill_s:.2f}",
        "after kill": lambda r: f"{r.rss_crash_mb:,.0f}",
    }
    for column in columns:
        memory_table.add_column(column, justify="right")
    for r in reports:
        memory_table.add_row(*(cell(r) for cell in columns.values()))
    console.print(memory_table)
    cpu = Table(title="server CPU per operation, µs (stat ticks/schedstat)")
    cpu.add_column("proxies (appended)", justify="right")
    for op in OPS:
        cpu.add_column(op, justify="right")
    for r in reports:
        by_op = {c.op: c for c in r.costs}
        cells = [
            "-" if c is None else f"{c.cpu_us:,.0f}/{c.sched_us:,.0f}" + fault(c)
            for c in (by_op.get(op) for op in OPS)
        ]
        cpu.add_row(f"{r.proxies:,} ({r.append_proxies:,})", *cells)
    console.print(cpu)


def fault(cost: Cost) -> str:
    return "" if cost.ok == cost.count else f" ({cost.count - cost.ok:,} of {cost.count:,} failed)"


def document(reports: list[SizeReport]) -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cpus": os.cpu_count(),
        "load_average": load(),
        "sizes": [asdict(r) for r in reports],
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=2) + "\n")
