"""One crawl of the Scrapy pool benchmark (bench/scrapy_pool.py), in a process of its own so
each gets a fresh Twisted reactor: pages 0 to N-1 at once, none followed, through no proxy
(``direct``), scrapy-rotating-proxies over given proxy URLs (``rotating``), or the client
library's middleware (``egress``). Writes ``{"seconds": ..., "stats": {...}}`` to stdout."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response

CONCURRENCY = 32


class PagesSpider(scrapy.Spider):
    name = "pages"

    def __init__(self, base: str, pages: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base, self.pages = base, pages

    async def start(self) -> AsyncIterator[Any]:
        for page in range(self.pages):
            yield scrapy.Request(f"{self.base}/page/{page}", callback=self.parse)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield {"url": response.url}


def settings(mode: str, api: str, proxies: list[str], pool: int) -> dict[str, Any]:
    common: dict[str, Any] = {
        "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
        "CONCURRENT_REQUESTS": CONCURRENCY,
        "DOWNLOAD_TIMEOUT": 30,
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "RETRY_ENABLED": False,
        "LOG_LEVEL": "WARNING",
    }
    if mode == "rotating":
        middlewares = {
            "rotating_proxies.middlewares.RotatingProxyMiddleware": 610,
            "rotating_proxies.middlewares.BanDetectionMiddleware": 620,
        }
        return {**common, "DOWNLOADER_MIDDLEWARES": middlewares, "ROTATING_PROXY_LIST": proxies}
    if mode == "egress":
        return {
            **common,
            "DOWNLOADER_MIDDLEWARES": {"egress_proxies_client.scrapy.LeaseMiddleware": 740},
            "EGRESS_API_URL": api,
            "EGRESS_HOLDER": "bench-scrapy-pool",
            "EGRESS_POOL_SIZE": pool,
        }
    return common


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="One crawl of the Scrapy pool benchmark.")
    parser.add_argument("--mode", choices=["direct", "rotating", "egress"], required=True)
    parser.add_argument("--site", required=True)
    parser.add_argument("--pages", type=int, required=True)
    parser.add_argument("--api", default="")
    parser.add_argument("--proxy", action="append", default=[])
    parser.add_argument("--pool", type=int, default=4)
    args = parser.parse_args(argv)
    process = CrawlerProcess(settings=settings(args.mode, args.api, args.proxy, args.pool))
    crawler = process.create_crawler(PagesSpider)
    process.crawl(crawler, base=args.site, pages=args.pages)
    started = time.perf_counter()
    process.start()
    seconds = time.perf_counter() - started
    assert crawler.stats is not None
    json.dump({"seconds": seconds, "stats": crawler.stats.get_stats()}, sys.stdout, default=str)


if __name__ == "__main__":
    main()
