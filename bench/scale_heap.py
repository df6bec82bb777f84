"""Where discovery's bytes are with a fleet in its views: a ``tracemalloc`` snapshot of
``egress-proxies run discovery`` once it has caught up and gone idle, the top lines and files.

The store is filled as ``bench.scale_fleet`` fills one (``--proxies`` Ready, healthy proxies, 7
events each) and served with the product's configuration. Discovery runs as a deployment runs
it, inside a wrapper process (``python -m bench.scale_heap worker SNAPSHOT -- ARGS``) that starts
``tracemalloc`` before anything is imported and writes a snapshot on SIGUSR1; the benchmark sends
it once ``/healthz`` answers 200 and the process is idle (its checkpoint writer has folded the
fleet once). Tracing slows the process several times and adds its own bookkeeping to its RSS, so
no time or RSS of this run is a figure: only the traced bytes by the line that allocated them
(one frame: where the object was made, not who keeps it), and ``VmRSS`` against the traced total,
the rest being the interpreter, modules' code and allocations outside Python's allocator.

Run: ``python -m bench.scale_heap [--proxies 10000] [--top 20] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

from bench.scale_fleet import (
    ROOT,
    History,
    fill_store,
    idle,
    load1,
    memory,
    product_server,
    proxy_uid,
    publish_fleet,
    ready_history,
    running,
    service_argv,
    until_healthz,
)
from services.runtime.observability.logs import configure_logging
from services.runtime.ports import free_port

# ------------------------------------------------------------------------- the worker process


def worker(snapshot: Path, argv: list[str]) -> None:
    """Trace from the first import on, then run the CLI; SIGUSR1 writes a snapshot."""
    tracemalloc.start(1)

    def dump(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        partial = snapshot.with_suffix(".partial")
        tracemalloc.take_snapshot().dump(str(partial))
        partial.replace(snapshot)  # whole or absent: the benchmark waits for the name

    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["egress-proxies", *argv]
    from services.cli.main import main  # noqa: PLC0415  # imported once tracing has started

    main()


# ------------------------------------------------------------------ the benchmark's side of it


@dataclass(frozen=True, slots=True)
class Line:
    where: str
    mb: float
    blocks: int


@dataclass
class Heap:
    proxies: int
    rss_mb: float = 0.0
    traced_mb: float = 0.0
    caught_up_s: float = 0.0
    lines: list[Line] = field(default_factory=list)
    files: list[Line] = field(default_factory=list)
    load: float = 0.0


def top(snapshot: tracemalloc.Snapshot, key: str, n: int) -> list[Line]:
    out = []
    for stat in snapshot.statistics(key)[:n]:
        frame = stat.traceback[0]
        path = Path(frame.filename)
        try:
            name = str(path.relative_to(ROOT))
        except ValueError:  # a library's file: from its package's directory on
            parts = path.parts
            name = "/".join(
                parts[parts.index("site-packages") + 1 :]
                if "site-packages" in parts
                else parts[-2:]
            )
        where = f"{name}:{frame.lineno}" if key == "lineno" else name
        out.append(Line(where, round(stat.size / 1e6, 2), stat.count))
    return out


async def measure(tmp: Path, proxies: int, n: int, timeout: float = 900.0) -> Heap:
    def fleet() -> Iterator[History]:
        for i in range(proxies):
            uid = proxy_uid(i)
            yield ready_history(uid, f"http://127.0.0.1:3128/{uid}")

    data = tmp / "store"
    await fill_store(data, lambda conn: publish_fleet(conn.js, fleet()))
    heap = Heap(proxies)
    snapshot = tmp / "discovery.heap"
    async with product_server(data) as (server, _):
        api_port, metrics_port = free_port(), free_port()
        argv = service_argv("discovery", server.url, metrics_port, "--port", str(api_port))
        cli = argv[argv.index("services.cli.main") + 1 :]
        wrapped = [sys.executable, "-m", "bench.scale_heap", "worker", str(snapshot), "--", *cli]
        async with running("discovery", wrapped, tmp / "discovery.log") as api:
            heap.caught_up_s = round(await until_healthz(api, api_port, timeout), 1)
            await idle(api.pid, limit=timeout)
            heap.rss_mb = memory(api.pid).get("VmRSS", 0.0)
            heap.load = load1()
            os.kill(api.pid, signal.SIGUSR1)
            deadline = time.monotonic() + timeout
            while not snapshot.exists():
                api.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError("discovery wrote no heap snapshot")
                await asyncio.sleep(0.2)
    taken = tracemalloc.Snapshot.load(str(snapshot))
    heap.traced_mb = round(sum(s.size for s in taken.statistics("filename")) / 1e6, 1)
    heap.lines = top(taken, "lineno", n)
    heap.files = top(taken, "filename", n)
    return heap


def render(heap: Heap) -> str:
    rows = [
        f"discovery with {heap.proxies:,} proxies: {heap.rss_mb:.0f} MB resident under tracing, "
        f"{heap.traced_mb:.1f} MB traced (load {heap.load})",
        "top lines (MB, blocks):",
        *(f"  {x.mb:8.2f} {x.blocks:9,}  {x.where}" for x in heap.lines),
        "top files (MB, blocks):",
        *(f"  {x.mb:8.2f} {x.blocks:9,}  {x.where}" for x in heap.files),
    ]
    return "\n".join(rows)


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        rest = sys.argv[2:]
        worker(Path(rest[0]), rest[2:] if rest[1:2] == ["--"] else rest[1:])
        return
    parser = argparse.ArgumentParser(prog="python -m bench.scale_heap", description=__doc__)
    parser.add_argument("--proxies", type=int, default=10_000)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    configure_logging("error")
    with tempfile.TemporaryDirectory(prefix="bench-scale-heap-") as tmp:
        heap = asyncio.run(measure(Path(tmp), args.proxies, args.top))
    print(render(heap))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(heap), indent=2) + "\n")


if __name__ == "__main__":
    main()
