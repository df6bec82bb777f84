"""A real Scrapy crawl through proxies leased from the discovery API, as a crawler would run it.

``LeaseMiddleware`` leases a proxy for each request, naming the request's host as the lease's
``target``, and sends the request through it. When the response comes back it reports how it went
(403 or 429: ``blocked``, so the API keeps that proxy from the host; 5xx: ``failed``; else
``success``), releases the lease, and sends a blocked request again, through another proxy. When
the spider closes it releases whatever its holder still holds.

The API is called with blocking ``urllib`` on a thread pool of its own, so the reactor keeps
downloading while a lease request waits for a free proxy.

Run in its own process (Twisted's reactor stays out of the test's event loop)::

    python -m tests.support.crawl_spider --start URL --api URL [--api URL] --holder NAME

Scrapy logs to stderr; once the crawl is over, its stats are written to stdout as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import quote, urlsplit

import scrapy
from scrapy import signals
from scrapy.crawler import Crawler, CrawlerProcess
from scrapy.http import Response, TextResponse

LEASE = "egress_lease"
"""The request's lease, in ``request.meta``."""
CONCURRENCY = 8
LEASE_TTL = 60.0
WAIT_SECONDS = 5
"""How long the API holds a lease request while every proxy for the target is busy."""
ACQUIRE_DEADLINE = 20.0
"""How long one request keeps asking before it gives up (an error in the crawl's log)."""


class LeaseError(Exception):
    """The API did not answer as the contract says; the request fails with this."""


@dataclass(frozen=True, slots=True)
class Lease:
    id: str
    api: str
    """The replica that granted it: its view shows the lease at once, so reports go there too."""
    proxy_uid: str
    proxy_url: str


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""The API is reached directly, whatever proxy the environment names."""


def call(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any, float]:
    """Status, decoded JSON body (None when empty) and ``Retry-After`` (0 without one)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with _DIRECT.open(request, timeout=WAIT_SECONDS + 10) as answer:
            status, text, retry = answer.status, answer.read(), "0"
    except urllib.error.HTTPError as error:
        status, text, retry = error.code, error.read(), error.headers.get("Retry-After", "0")
    return status, json.loads(text) if text else None, float(retry)


class DiscoveryClient:
    """Blocking calls to the API, alternating the replicas for new leases."""

    def __init__(self, apis: list[str], holder: str) -> None:
        self.apis = apis
        self.holder = holder
        self._next: Iterator[str] = itertools.cycle(apis)

    def acquire(self, target: str) -> Lease:
        body = {
            "holder": self.holder,
            "ttlSeconds": LEASE_TTL,
            "target": target,
            "waitSeconds": WAIT_SECONDS,
        }
        deadline = time.monotonic() + ACQUIRE_DEADLINE
        while True:
            api = next(self._next)
            status, answer, retry = call("POST", f"{api}/v1/leases", body)
            if status == 201:
                proxy = answer["proxy"]
                return Lease(answer["id"], api, proxy["uid"], proxy["url"])
            if status != 503 or time.monotonic() > deadline:
                raise LeaseError(f"POST /v1/leases for {target}: {status} {answer}")
            time.sleep(min(retry, 1.0))

    def report(self, lease: Lease, outcome: str, target: str, detail: str) -> None:
        body = {"outcome": outcome, "target": target, "detail": detail}
        status, answer, _ = call("POST", f"{lease.api}/v1/leases/{lease.id}/report", body)
        if status != 204:
            raise LeaseError(f"report {outcome} on {lease.proxy_uid}: {status} {answer}")

    def release(self, lease: Lease) -> None:
        status, answer, _ = call("DELETE", f"{lease.api}/v1/leases/{lease.id}")
        if status != 204:
            raise LeaseError(f"release of {lease.proxy_uid}: {status} {answer}")

    def release_all(self) -> int:
        url = f"{self.apis[0]}/v1/leases?holder={quote(self.holder)}"
        status, answer, _ = call("DELETE", url)
        if status != 200:
            raise LeaseError(f"DELETE /v1/leases?holder={self.holder}: {status} {answer}")
        return int(answer["released"])


def outcome_of(status: int) -> str:
    if status in (403, 429):
        return "blocked"
    return "failed" if status >= 500 else "success"


class LeaseMiddleware:
    """A downloader middleware: one lease per request (see the module docstring). Placed just
    before ``HttpProxyMiddleware`` (750), so the proxy is set before it looks, and its responses
    are seen before ``RetryMiddleware`` and ``RedirectMiddleware`` turn them into new requests."""

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        self.client = DiscoveryClient(settings.getlist("EGRESS_APIS"), settings["EGRESS_HOLDER"])
        self.stats = crawler.stats
        self.pool = ThreadPoolExecutor(2 * CONCURRENCY, thread_name_prefix="discovery")
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    async def _api(self, method: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, method, *args)

    async def process_request(
        self, request: scrapy.Request, spider: scrapy.Spider | None = None
    ) -> None:
        lease: Lease = await self._api(self.client.acquire, urlsplit(request.url).hostname)
        request.meta[LEASE] = lease
        request.meta["proxy"] = lease.proxy_url

    async def process_response(
        self, request: scrapy.Request, response: Response, spider: scrapy.Spider | None = None
    ) -> scrapy.Request | Response:
        lease: Lease | None = request.meta.pop(LEASE, None)
        if lease is None:
            return response
        outcome = outcome_of(response.status)
        host = urlsplit(request.url).hostname
        await self._api(self.client.report, lease, outcome, host, f"HTTP {response.status}")
        await self._api(self.client.release, lease)
        self.stats.inc_value(f"leases/{outcome}")
        if outcome == "blocked":
            return request.replace(dont_filter=True)
        return response

    async def process_exception(
        self, request: scrapy.Request, exception: Exception, spider: scrapy.Spider | None = None
    ) -> None:
        """The proxy could not be used (refused, reset, timed out): released, and the retry
        middleware decides whether to try again, with a new lease."""
        lease: Lease | None = request.meta.pop(LEASE, None)
        if lease is not None:
            host = urlsplit(request.url).hostname
            await self._api(self.client.report, lease, "failed", host, repr(exception)[:1000])
            await self._api(self.client.release, lease)
            self.stats.inc_value("leases/failed")

    def spider_closed(self) -> None:
        self.stats.set_value("leases/released_at_close", self.client.release_all())
        self.pool.shutdown()


class SiteSpider(scrapy.Spider):
    """Every page reachable from the start page, one item per page."""

    name = "site"

    def __init__(self, start: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [start]

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        assert isinstance(response, TextResponse)
        yield {"url": response.url, "status": response.status}
        yield from response.follow_all(css="a[href]", callback=self.parse)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A Scrapy crawl through leased proxies.")
    parser.add_argument("--start", required=True, help="the first page")
    parser.add_argument("--api", action="append", required=True, help="a discovery replica")
    parser.add_argument("--holder", required=True)
    args = parser.parse_args(argv)
    process = CrawlerProcess(
        settings={
            "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
            "CONCURRENT_REQUESTS": CONCURRENCY,
            "CONCURRENT_REQUESTS_PER_DOMAIN": CONCURRENCY,
            "DOWNLOADER_MIDDLEWARES": {"tests.support.crawl_spider.LeaseMiddleware": 740},
            "DOWNLOAD_TIMEOUT": 10,
            "CLOSESPIDER_TIMEOUT": 50,
            # No consoles listening, nor job files in the user's home (Scrapy 2.19+).
            "TELNETCONSOLE_ENABLED": False,
            "REMOTE_CONTROL_ENABLED": False,
            "ROBOTSTXT_OBEY": False,
            "LOG_LEVEL": "INFO",
            "EGRESS_APIS": args.api,
            "EGRESS_HOLDER": args.holder,
        }
    )
    crawler = process.create_crawler(SiteSpider)
    process.crawl(crawler, start=args.start)
    process.start()
    assert crawler.stats is not None
    json.dump(crawler.stats.get_stats(), sys.stdout, default=str)


if __name__ == "__main__":
    main()
