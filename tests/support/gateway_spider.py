"""A Scrapy crawl through the gateway with nothing of ours: Scrapy's own ``HttpProxyMiddleware``
(docs/gateway.md), run in its own process (Scrapy's reactor is its own).

``python -m tests.support.gateway_spider ASKS`` where ASKS is a JSON list of ``{"url": ...,
"proxy": ...}``: a request with a ``proxy`` carries it in ``meta["proxy"]`` (the proxy URL with
the login, user name parameters included); one without leaves through the proxy of the
``http_proxy``/``https_proxy`` environment, which the middleware reads at start. Prints one JSON
line per answer: the URL, its status, its body and the ``X-Egress-Proxy`` it came with.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response
from twisted.python.failure import Failure

SETTINGS = {
    "LOG_LEVEL": "WARNING",
    "ROBOTSTXT_OBEY": False,
    "TELNETCONSOLE_ENABLED": False,
    "RETRY_ENABLED": False,
    "DOWNLOAD_TIMEOUT": 20,
    "CONCURRENT_REQUESTS": 1,
    "HTTPERROR_ALLOW_ALL": True,
}


class Fetch(scrapy.Spider):
    name = "gateway-fetch"

    def __init__(self, asks: list[dict[str, str]], found: list[dict[str, Any]]) -> None:
        super().__init__()
        self.asks = asks
        self.found = found

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for ask in self.asks:
            meta = {"proxy": ask["proxy"]} if ask.get("proxy") else {}
            yield scrapy.Request(
                ask["url"], meta=meta, dont_filter=True, callback=self.got, errback=self.failed
            )

    def got(self, response: Response) -> None:
        self.found.append(
            {
                "url": response.url,
                "status": response.status,
                "body": response.text,
                "proxy": (response.headers.get("X-Egress-Proxy") or b"").decode(),
            }
        )

    def failed(self, failure: Failure) -> None:
        self.found.append({"url": "", "status": 0, "body": repr(failure.value), "proxy": ""})


def main() -> None:
    asks = json.loads(sys.argv[1])
    found: list[dict[str, Any]] = []
    process = CrawlerProcess(SETTINGS)
    process.crawl(Fetch, asks=asks, found=found)
    process.start()
    for answer in found:
        print(json.dumps(answer))


if __name__ == "__main__":
    main()
