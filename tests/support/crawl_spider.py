"""A real Scrapy crawl through proxies leased from the discovery API, as a crawler would run it.

All the leasing is ``egress_proxies_client.scrapy.LeaseMiddleware``: the spider's glue is the few
settings under "the glue" below. The spider follows every link; pages whose number is a multiple
of ``SESSION_EVERY`` are fetched in one session (``meta["session"]``), so through one proxy.

Run in its own process (Twisted's reactor stays out of the test's event loop)::

    python -m tests.support.crawl_spider --start URL --api URL --holder NAME

With ``--flat N`` the spider instead asks for pages 0 to N-1 at once (each a start URL, no link
followed) with the middleware's default settings and ``--selector``: more requests at a time than
proxies matching the selector.

Scrapy logs to stderr; once the crawl is over, its stats are written to stdout as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response, TextResponse

CONCURRENCY = 16
POOL_SIZE = 8
LEASE_TTL = 2.0
"""Shorter than the crawl, so the pool's leases must be renewed while it runs."""
DELAY = 0.1
"""Between two requests through one proxy (Scrapy's delay is per download slot, and the
middleware gives each proxy its own): the session's pages alone, one proxy's, take seconds."""
SESSION = "checkout"
SESSION_EVERY = 5


def page_number(path: str) -> int:
    return int(path.rsplit("/", 1)[1])


class SiteSpider(scrapy.Spider):
    """Every page reachable from the start page, one item per page."""

    name = "site"

    def __init__(self, start: str, flat: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [start]
        self.flat = flat

    async def start(self) -> AsyncIterator[Any]:
        if not self.flat:
            async for request in super().start():
                yield request
            return
        base = self.start_urls[0].rsplit("/", 1)[0]
        for page in range(self.flat):
            meta = {"session": SESSION} if page and page % SESSION_EVERY == 0 else {}
            yield scrapy.Request(f"{base}/{page}", callback=self.parse, meta=meta)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        assert isinstance(response, TextResponse)
        yield {"url": response.url, "status": response.status}
        if self.flat:
            return
        for href in response.css("a::attr(href)").getall():
            meta = {"session": SESSION} if page_number(href) % SESSION_EVERY == 0 else {}
            yield response.follow(href, callback=self.parse, meta=meta)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A Scrapy crawl through leased proxies.")
    parser.add_argument("--start", required=True, help="the first page")
    parser.add_argument("--api", required=True, help="the discovery API")
    parser.add_argument("--holder", required=True)
    parser.add_argument("--flat", type=int, default=0, help="ask for pages 0 to N-1 at once")
    parser.add_argument("--selector", default="", help="EGRESS_SELECTOR, as JSON")
    args = parser.parse_args(argv)
    # The flat crawl keeps the middleware's defaults (pool size, TTL) and Scrapy's concurrency.
    tuned: dict[str, Any] = (
        {}
        if args.flat
        else {
            "CONCURRENT_REQUESTS": CONCURRENCY,
            "DOWNLOAD_DELAY": DELAY,
            "EGRESS_POOL_SIZE": POOL_SIZE,
            "EGRESS_LEASE_TTL": LEASE_TTL,
        }
    )
    process = CrawlerProcess(
        settings={
            "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
            "DOWNLOAD_TIMEOUT": 10,
            "CLOSESPIDER_TIMEOUT": 50,
            # No consoles listening, nor job files in the user's home (Scrapy 2.19+).
            "TELNETCONSOLE_ENABLED": False,
            "REMOTE_CONTROL_ENABLED": False,
            "ROBOTSTXT_OBEY": False,
            "LOG_LEVEL": "INFO",
            # The glue.
            "DOWNLOADER_MIDDLEWARES": {"egress_proxies_client.scrapy.LeaseMiddleware": 740},
            "EGRESS_API_URL": args.api,
            "EGRESS_HOLDER": args.holder,
            "EGRESS_SELECTOR": args.selector,
            **tuned,
        }
    )
    crawler = process.create_crawler(SiteSpider)
    process.crawl(crawler, start=args.start, flat=args.flat)
    process.start()
    assert crawler.stats is not None
    json.dump(crawler.stats.get_stats(), sys.stdout, default=str)


if __name__ == "__main__":
    main()
