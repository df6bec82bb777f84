"""Scrapy through leased proxies: the client library's middleware beside scrapy-rotating-proxies.

The same spider (bench/scrapy_pool_spider.py: N pages at once, ``CONCURRENT_REQUESTS=32``) crawls
a local site that answers each page after ``--latency`` seconds, three ways in one run:

- **direct**: no proxy, the site's own pace;
- **rotating**: scrapy-rotating-proxies over the URLs of 4 leases held for the run on 4 local
  Squids (the local provider's, tests/support/crawl_squid.py);
- **egress**: ``LeaseMiddleware`` leasing those 4 Squids itself (``EGRESS_POOL_SIZE=4``), once the
  rotating run's leases are released.

Reported: pages/s of each, the ratio egress/rotating (target >= 0.95, docs/benchmarks.md), and
whether every page was fetched exactly once::

    python -m bench.scrapy_pool --pages 400 --latency 0.05

The API runs without a cooldown and the site blocks no proxy, unless told: ``--cooldown`` (the
API's ``--lease-cooldown``), ``--blocks N`` (the site refuses the first N proxies it sees),
``--modes`` (which crawls) and ``--egress-crawls K`` (the middleware's crawl K times back to
back, as a crawl that re-leases the proxies it just released: D153)::

    python -m bench.scrapy_pool --modes egress --egress-crawls 3 --cooldown 10 --blocks 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from egress_proxies_client import AsyncClient
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import connect
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.crawl_site import crawl_site
from tests.support.crawl_squid import tagged_squids
from tests.support.discovery import discovery, ready_proxy
from tests.support.waiting import until

ROOT = Path(__file__).resolve().parent.parent
MODES = ("direct", "rotating", "egress")
PROXIES = 4
TARGET = 0.95


@dataclass(frozen=True, slots=True)
class Options:
    """What the run varies beyond pages and latency (the module's docstring)."""

    cooldown: float = 0.0
    blocks: int = 0
    modes: tuple[str, ...] = MODES
    egress_crawls: int = 1


@dataclass(frozen=True, slots=True)
class Run:
    mode: str
    pages: int
    seconds: float
    fetched_once: bool
    """Every page fetched exactly once, with 200."""
    span: float
    """Seconds from the site's first answer to its last: the crawl's pace without Scrapy's
    start and close."""

    @property
    def pages_per_second(self) -> float:
        return self.pages / self.seconds if self.seconds else 0.0


async def crawl(mode: str, site: Any, pages: int, api: str, proxies: list[str]) -> Run:
    site.visits.clear()
    command = [sys.executable, "-m", "bench.scrapy_pool_spider", "--mode", mode]
    command += ["--site", site.url.rsplit("/page/", 1)[0], "--pages", str(pages), "--api", api]
    for url in proxies:
        command += ["--proxy", url]
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{mode} crawl ended with {process.returncode}: {err.decode()[-3000:]}")
    result = json.loads(out)
    counts = Counter(v.path for v in site.visits if v.status == 200)
    once = counts == Counter(f"/page/{i}" for i in range(pages)) and all(
        v.status == 200 or v.proxy in site.refused for v in site.visits
    )
    scraped = int(result["stats"].get("item_scraped_count", 0))
    times = [v.at for v in site.visits]
    span = max(times) - min(times) if times else 0.0
    return Run(mode, scraped, float(result["seconds"]), once and scraped == pages, span)


async def measure(
    pages: int, latency: float, work: Path, options: Options | None = None
) -> list[Run]:
    options = options or Options()
    server = EmbeddedNatsServer(data_dir=work / "nats")
    await server.start()
    try:
        conn = await connect(server.url)
        try:
            await ensure_streams(conn.js)
            store = JetStreamEventStore(conn.nc, conn.js)
            uids = [f"bench-px{i}" for i in range(PROXIES)]
            async with (
                tagged_squids(work / "squids", uids) as squids,
                discovery(server.url, lease_cooldown=options.cooldown) as (_, api),
            ):
                for squid in squids:
                    await ready_proxy(store, squid.uid, port=squid.port)
                await until(lambda: _available(api), what="every proxy available")
                blocks = options.blocks
                with crawl_site(
                    pages, block=blocks > 0, blocks=blocks, latency=latency, proxied=False
                ) as site:
                    runs = []
                    if "direct" in options.modes:
                        runs.append(await crawl("direct", site, pages, api, []))
                    if "rotating" in options.modes:
                        runs.append(await _rotating(site, pages, api, len(squids)))
                    for n in range(options.egress_crawls if "egress" in options.modes else 0):
                        run = await crawl("egress", site, pages, api, [])
                        runs.append(replace(run, mode="egress" + (f" {n + 1}" if n else "")))
                return runs
        finally:
            await conn.close()
    finally:
        await server.stop()


async def _rotating(site: Any, pages: int, api: str, proxies: int) -> Run:
    """scrapy-rotating-proxies over the URLs of ``proxies`` leases held for the crawl."""
    async with AsyncClient(api, holder="bench-rotating") as client:
        held = [client.lease({}, 300) for _ in range(proxies)]
        for lease in held:
            await lease.open()
        run = await crawl("rotating", site, pages, api, [lease.url for lease in held])
        for lease in held:
            await lease.close()
    return run


async def _available(api: str) -> bool:
    async with httpx.AsyncClient(base_url=api) as client:
        answer = await client.get("/v1/proxies")
    return sum(1 for p in answer.json()["items"] if p["available"]) == PROXIES


def report(runs: list[Run]) -> dict[str, Any]:
    by = {run.mode: run for run in runs}
    rotating = by["rotating"].pages_per_second if "rotating" in by else 0.0
    egress = by.get("egress")
    ratio = egress.pages_per_second / rotating if rotating and egress else 0.0
    paced = egress.span and by["rotating"].span / egress.span if rotating and egress else 0.0
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "runs": [
            {
                **asdict(run),
                "seconds": round(run.seconds, 2),
                "span": round(run.span, 2),
                "pages_per_second": round(run.pages_per_second, 1),
            }
            for run in runs
        ],
        "egress_over_rotating": round(ratio, 3),
        "egress_over_rotating_by_span": round(paced, 3),
        "target": TARGET,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per answer")
    parser.add_argument("--cooldown", type=float, default=0.0, help="the API's lease cooldown")
    parser.add_argument("--blocks", type=int, default=0, help="proxies the site refuses")
    parser.add_argument("--modes", default=",".join(MODES), help="crawls, comma-separated")
    parser.add_argument("--egress-crawls", type=int, default=1, help="middleware crawls")
    args = parser.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    if not set(modes) <= set(MODES):
        parser.error(f"--modes: each one of {', '.join(MODES)}")
    options = Options(args.cooldown, args.blocks, modes, args.egress_crawls)
    with tempfile.TemporaryDirectory(prefix="bench-scrapy-") as work:
        runs = asyncio.run(measure(args.pages, args.latency, Path(work), options))
    print(json.dumps(report(runs), indent=2))


if __name__ == "__main__":
    main()
