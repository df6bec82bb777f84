"""The Scrapy pool benchmark measures what it claims, run tiny with the code the full run uses.

Timings are never asserted (they depend on the machine): only that each of the three crawls
(direct, scrapy-rotating-proxies, the client library's middleware) fetched every page once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import scrapy_pool

pytestmark = pytest.mark.integration


async def test_each_crawl_fetches_every_page_once(tmp_path: Path) -> None:
    runs = await scrapy_pool.measure(pages=24, latency=0.01, work=tmp_path)
    assert [run.mode for run in runs] == list(scrapy_pool.MODES)
    for run in runs:
        assert (run.pages, run.fetched_once) == (24, True), run.mode
        assert run.seconds > 0
    figures = scrapy_pool.report(runs)
    assert figures["egress_over_rotating"] > 0
