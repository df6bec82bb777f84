"""A Scrapy downloader middleware that sends every request through a leased egress proxy.

Enable it just before Scrapy's ``HttpProxyMiddleware`` (750), which turns the credentials of a
proxy URL into the ``Proxy-Authorization`` header::

    DOWNLOADER_MIDDLEWARES = {"egress_proxies_client.scrapy.LeaseMiddleware": 740}
    EGRESS_API_URL = "http://discovery:8080"

Settings: ``EGRESS_API_URL`` (required), ``EGRESS_TOKEN``, ``EGRESS_SELECTOR`` (a dict or its
JSON), ``EGRESS_PROXY_POOL`` (a ProxyPool, ``NAMESPACE/NAME``, to lease members of),
``EGRESS_POOL_SIZE`` (leases held at once, 8), ``EGRESS_BLOCK_CODES`` (statuses meaning
"this address is blocked", 403 and 429), ``EGRESS_LEASE_TTL`` (seconds, 300; leases are renewed
in the background), ``EGRESS_HOLDER`` (the leases' holder, unique per crawl by default),
``EGRESS_ACQUIRE_TIMEOUT`` (how long a request waits for a proxy, 60 s),
``EGRESS_BLOCK_RETRIES`` (how many other proxies a blocked request is tried through, 5),
``EGRESS_LEASE_CONCURRENCY`` (requests one lease carries at once: the concurrency of the proxy's
download slot, ``CONCURRENT_REQUESTS_PER_DOMAIN``, or 1 with a ``DOWNLOAD_DELAY``).

Each request is lent a lease of the pool (at most ``EGRESS_LEASE_CONCURRENCY`` at once, see
``_pool``) and
gets ``meta["proxy"]`` from the lease's latest answer, and ``meta["download_slot"]`` of its
proxy, so ``DOWNLOAD_DELAY`` and the slot's concurrency apply per egress address. A response with
a block code is reported ``blocked`` with the request's host as target, that proxy is not used for
the host again, and the request is sent again through another proxy. 5xx and download errors are
reported ``failed``. Requests with the same ``meta["session"]`` go through the same proxy, which
is leased again by its uid when the pool let it go. Every lease is released when the spider
closes. Needs Scrapy 2.14 or later with the asyncio reactor (its default).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Self
from urllib.parse import urlsplit

from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.utils.asyncio import is_asyncio_available

from egress_proxies_client import _protocol as protocol
from egress_proxies_client._pool import LeasePool, Pooled
from egress_proxies_client.aio import AsyncClient
from egress_proxies_client.errors import EgressError, UnknownLease

logger = logging.getLogger(__name__)

LEASE_KEY = "egress_lease"
"""The request's lease while it is out, in ``request.meta``."""
RETRIES_KEY = "egress_block_retries"
SESSION_KEY = "session"
PROXY_AUTH_REQUIRED = 407


def selector_setting(value: Any) -> dict[str, str]:
    """``EGRESS_SELECTOR`` as a dict of strings, from a dict or its JSON text."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(
                f'EGRESS_SELECTOR: {value!r} is not JSON; write {{"country": "de"}}, or a dict'
            ) from exc
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(
            f'EGRESS_SELECTOR: {value!r} is not a map of strings; write {{"country": "de"}}'
        )
    return dict(value)


def pool_setting(value: Any) -> str | None:
    """``EGRESS_PROXY_POOL`` as the API's ``pool`` (``NAMESPACE/NAME``; the API checks the
    rest), or None when unset."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"EGRESS_PROXY_POOL: {value!r} is not a string; write crawl/de")
    return value


class LeaseMiddleware:
    """See the module docstring."""

    def __init__(self, crawler: Crawler) -> None:
        if not is_asyncio_available():
            raise ValueError(
                "egress_proxies_client.scrapy needs the asyncio reactor: set TWISTED_REACTOR = "
                '"twisted.internet.asyncioreactor.AsyncioSelectorReactor"'
            )
        settings = crawler.settings
        url = settings.get("EGRESS_API_URL")
        if not url:
            raise ValueError("EGRESS_API_URL: not set; set it to the discovery API's base URL")
        size = settings.getint("EGRESS_POOL_SIZE", 8)
        ttl = settings.getfloat("EGRESS_LEASE_TTL", 300.0)
        timeout = settings.getfloat("EGRESS_ACQUIRE_TIMEOUT", 60.0)
        # A lease never carries more than its proxy's download slot sends at once: a request
        # lent beyond that would wait in the slot's queue and could be sent after a block
        # arrived. A slot with a delay sends one at a time anyway
        # (docs/decisions/0097-a-pooled-request-waits-for-the.md).
        per_slot = settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN", 8)
        delayed = settings.getfloat("DOWNLOAD_DELAY", 0.0) > 0
        concurrency = settings.getint("EGRESS_LEASE_CONCURRENCY", 1 if delayed else per_slot)
        if concurrency > per_slot or (delayed and concurrency > 1):
            raise ValueError(
                f"EGRESS_LEASE_CONCURRENCY: {concurrency} is more than the proxy's download slot "
                f"sends at once ({1 if delayed else per_slot}: CONCURRENT_REQUESTS_PER_DOMAIN, "
                "or 1 with a DOWNLOAD_DELAY); lower it"
            )
        for name, number, least in (
            ("EGRESS_LEASE_CONCURRENCY", concurrency, 1),
            ("EGRESS_POOL_SIZE", size, 1),
            ("EGRESS_LEASE_TTL", ttl, 1),
            ("EGRESS_ACQUIRE_TIMEOUT", timeout, 0),
        ):
            if number < least:
                raise ValueError(f"{name}: {number} is below {least}; raise it")
        codes = settings.getlist("EGRESS_BLOCK_CODES", [403, 429])
        self.block_codes = {int(code) for code in codes}
        self.block_retries = settings.getint("EGRESS_BLOCK_RETRIES", 5)
        self.stats = crawler.stats
        client = AsyncClient(
            url,
            settings.get("EGRESS_TOKEN") or None,
            holder=settings.get("EGRESS_HOLDER") or f"scrapy/{protocol.default_holder()}",
        )
        self.pool = LeasePool(
            client,
            selector=selector_setting(settings.get("EGRESS_SELECTOR")),
            pool=pool_setting(settings.get("EGRESS_PROXY_POOL")),
            ttl=ttl,
            size=size,
            acquire_timeout=timeout,
            concurrency=concurrency,
            count=lambda key: self._count(f"leases/{key}"),
        )
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def _count(self, key: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(f"egress/{key}")

    # ``spider`` is accepted for Scrapy versions that still pass it; never used.
    async def process_request(self, request: Request, spider: Spider | None = None) -> None:
        pooled = await self.pool.borrow(_host(request), request.meta.get(SESSION_KEY))
        request.meta[LEASE_KEY] = pooled
        # The latest answer's URL: its credentials may have changed at the last renewal.
        request.meta["proxy"] = pooled.held.url
        request.meta["download_slot"] = f"egress-proxy:{pooled.uid}"

    async def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Request | Response:
        pooled: Pooled | None = request.meta.pop(LEASE_KEY, None)
        if pooled is None:
            return response
        host, status = _host(request), response.status
        detail = f"HTTP {status}"
        drop = False
        try:
            if status == PROXY_AUTH_REQUIRED:
                # The proxy refused the lease's credentials: the lease is over for it.
                self._count("outcome/refused")
                drop = True
                return self._again(request, response, "refused")
            if status in self.block_codes:
                self._count("outcome/blocked")
                # The requests in flight on it when the block came are retried like this one;
                # the block is reported once (none is lent it for the host after it).
                if pooled.uid not in self.pool.blocked.get(host, ()):
                    self.pool.block(host, pooled.uid, request.meta.get(SESSION_KEY))
                    await self._report(pooled, "blocked", host, detail)
                return self._again(request, response, "blocked")
            if status >= 500:
                self._count("outcome/failed")
                await self._report(pooled, "failed", host, detail)
                return response
            self._count("outcome/success")
            if host not in pooled.vouched:
                await self._report(pooled, "success", host, detail)
            return response
        finally:
            await self.pool.give_back(pooled, drop=drop)

    async def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> None:
        """The proxy could not be used (refused, reset, timed out): reported, and the retry
        middleware decides whether to try again, with a lease lent anew."""
        pooled: Pooled | None = request.meta.pop(LEASE_KEY, None)
        if pooled is None:
            return
        try:
            if not isinstance(exception, IgnoreRequest):
                self._count("outcome/failed")
                await self._report(pooled, "failed", _host(request), repr(exception))
        finally:
            await self.pool.give_back(pooled)

    def _again(self, request: Request, response: Response, why: str) -> Request | Response:
        tried = int(request.meta.get(RETRIES_KEY, 0))
        if tried >= self.block_retries:
            self._count(f"retries/{why}/gave_up")
            return response
        self._count(f"retries/{why}")
        again = request.replace(dont_filter=True)
        again.meta[RETRIES_KEY] = tried + 1
        return again

    async def _report(self, pooled: Pooled, outcome: str, host: str, detail: str) -> None:
        if outcome == "success":
            pooled.vouched.add(host)
        elif outcome == "failed":
            pooled.vouched.clear()
        try:
            if outcome == "success":
                await pooled.held.report_success(host, detail)
            elif outcome == "blocked":
                await pooled.held.report_blocked(host, detail)
            else:
                await pooled.held.report_failed(host, detail)
        except UnknownLease as exc:
            pooled.held.lost = exc
            self._count("reports/unknown_lease")
        except EgressError as exc:
            logger.warning("egress: could not report %s on %s: %s", outcome, pooled.uid, exc)
            self._count("reports/error")
        else:
            self._count(f"reports/{outcome}")

    async def spider_closed(self) -> None:
        """Releases the pool, then whatever else the holder still holds (a lease whose release
        answer was lost), so the crawl leaves no lease to expire."""
        try:
            await self.pool.close()
            left = await self.pool.client.release_mine()
            if self.stats is not None:
                self.stats.set_value("egress/leases/released_at_close", left)
        finally:
            await self.pool.client.aclose()


def _host(request: Request) -> str:
    return urlsplit(request.url).hostname or ""
