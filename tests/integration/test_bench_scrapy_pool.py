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


async def test_back_to_back_crawls_on_a_blocking_site_each_fetch_every_page(
    tmp_path: Path,
) -> None:
    """The D153 figure's run: the API with a cooldown, the site refusing two proxies."""
    options = scrapy_pool.Options(cooldown=10.0, blocks=2, modes=("egress",), egress_crawls=2)
    runs = await scrapy_pool.measure(pages=24, latency=0.01, work=tmp_path, options=options)
    assert [run.mode for run in runs] == ["egress", "egress 2"]
    for run in runs:
        assert (run.pages, run.fetched_once) == (24, True), run.mode
    assert scrapy_pool.report(runs)["egress_over_rotating"] == 0.0  # no rotating crawl to compare
