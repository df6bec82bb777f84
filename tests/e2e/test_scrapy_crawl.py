"""A real Scrapy crawl through leased proxies, against a site that blocks one of them.

Eight real Squids (the local provider's, each naming itself to the site), Ready and healthy in the
log; two discovery replicas on a real nats-server; a local site of 200 pages that answers 403 to
whatever comes through the first proxy it sees. The crawl (tests/support/crawl_spider.py, in its own
process) uses the client library's ``LeaseMiddleware`` and nothing else: a pool of leases renewed
in the background, each lent to one request at a time, the request's host reported as ``target``.

What the contract guarantees, and so what is asserted: a lease holds its proxy exclusively, the
middleware lends a lease to one request at a time and reports before it releases, and once a
``blocked`` report for (proxy, host) is made, neither the middleware nor (during the back-off,
10 minutes, far longer than the crawl) the API lets that proxy carry a request to the host. So the
blocked proxy carries exactly one request to the site, the one it was blocked on; every page is
fetched once, with 200; the pages of the crawl's session all come through one proxy; and every
lease ends released when the spider closes, none left to expire, although the crawl outlasts
their TTL.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from events import subjects
from events.schemas import (
    AnyEvent,
    LeaseAcquired,
    LeaseExpired,
    LeaseReleased,
    LeaseRenewed,
    LeaseReported,
)
from events.store import Unreadable
from projections import lease as lease_fold
from projections.lease import LeaseView
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.crawl_site import crawl_site
from tests.support.crawl_spider import SESSION_EVERY, page_number
from tests.support.crawl_squid import tagged_squids
from tests.support.discovery import discovery, ready_proxy
from tests.support.system import ROOT
from tests.support.waiting import until

pytestmark = pytest.mark.e2e

PAGES = 200
UIDS = [f"crawl-{i}" for i in range(8)]
HOST = "127.0.0.1"
HOLDER = "scrapy-e2e"
CRAWL_TIMEOUT = 60.0


async def all_available(api: str) -> bool:
    async with httpx.AsyncClient(base_url=api) as client:
        items = (await client.get("/v1/proxies")).json()["items"]
    return sorted(p["uid"] for p in items if p["available"]) == sorted(UIDS)


async def crawl(start: str, api: str, *extra: str) -> dict[str, Any]:
    """Run the crawl to its end; its stats."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.crawl_spider",
        "--start",
        start,
        "--api",
        api,
        "--holder",
        HOLDER,
        *extra,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), CRAWL_TIMEOUT)
    except TimeoutError:
        process.kill()
        out, err = await process.communicate()
    log = err.decode(errors="replace")[-6000:]
    assert process.returncode == 0, f"the crawl ended with {process.returncode}:\n{log}"
    stats: dict[str, Any] = json.loads(out)
    assert stats.get("log_count/ERROR", 0) == 0, log
    return stats


@dataclass(frozen=True, slots=True)
class Logged:
    event: AnyEvent | Unreadable
    granted: bool
    """A claim the lease fold let hold."""


async def lease_log(store: JetStreamEventStore, uid: str) -> tuple[list[Logged], LeaseView | None]:
    """The proxy's lease events in order, and the fold of them all (None: never leased)."""
    view: LeaseView | None = None
    logged = []
    for recorded in (await store.read(subjects.lease(uid))).events:
        before = view.granted if view else 0
        view = lease_fold.apply(view, recorded)
        logged.append(Logged(recorded.event, view.granted > before))
    return logged, view


async def test_a_crawl_fetches_every_page_and_never_gets_the_blocked_proxy_again(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with (
        tagged_squids(tmp_path / "squids", UIDS) as squids,
        discovery(nats_server.url) as (_, first),
        discovery(nats_server.url) as (_, second),
    ):
        for squid in squids:
            await ready_proxy(jetstream_store, squid.uid, port=squid.port)
        for api in (first, second):
            await until(partial(all_available, api), what=f"{api} sees every proxy")

        with crawl_site(PAGES) as site:
            stats = await crawl(site.url, first)
            visits = list(site.visits)
        blocked = site.blocked

        # The site: every page once, with 200, through a proxy; the blocked one carried exactly
        # the request it was blocked on.
        fetched = sorted(v.path for v in visits if v.status == 200)
        assert fetched == sorted(f"/page/{i}" for i in range(PAGES))
        assert {v.proxy for v in visits if v.status == 200} <= set(UIDS) - {blocked}
        assert [(v.proxy, v.status) for v in visits if v.status != 200] == [(blocked, 403)]
        # The session's pages: all through one proxy (not the blocked one, which lost it).
        session = {
            v.proxy
            for v in visits
            if v.status == 200 and page_number(v.path) % SESSION_EVERY == 0 and v.path != "/page/0"
        }
        assert len(session) == 1, session
        # The crawler's side of it: one lease per proxy at most, each used and released.
        assert stats["item_scraped_count"] == PAGES
        assert (stats["egress/outcome/success"], stats["egress/outcome/blocked"]) == (PAGES, 1)
        assert (stats["egress/reports/blocked"], stats["egress/retries/blocked"]) == (1, 1)
        assert "egress/outcome/failed" not in stats
        acquired = stats["egress/leases/acquired"]
        assert acquired <= len(UIDS)
        # A success is reported once per lease and host: not an event per page.
        assert stats["egress/reports/success"] <= acquired - 1
        assert stats["egress/leases/released"] == acquired
        assert stats["egress/leases/released_at_close"] == 0  # the pool released them all

        # The log: one claim ever held on the blocked proxy, naming the host; then its one report,
        # blocked; no claim held after that.
        logged, _ = await lease_log(jetstream_store, blocked)
        assert logged, f"{blocked} was never leased"
        held = [item.event for item in logged if item.granted]
        assert len(held) == 1
        assert isinstance(held[0], LeaseAcquired)
        assert held[0].target == HOST
        reports = [item.event for item in logged if isinstance(item.event, LeaseReported)]
        assert [(r.outcome, r.target) for r in reports] == [("blocked", HOST)]
        reported = next(i for i, item in enumerate(logged) if item.event is reports[0])
        assert not any(item.granted for item in logged[reported:])

        # Every lease released, none left to expire: in the log and on both replicas (the crawl
        # asked the first; the second shows what the log says).
        # The crawl outlasted the leases' TTL: they were renewed in the background, not lost.
        granted = renewed = 0
        for uid in UIDS:
            logged, view = await lease_log(jetstream_store, uid)
            if view is None:
                continue  # the pool never needed this one
            releases = sum(isinstance(item.event, LeaseReleased) for item in logged)
            assert (view.current, releases) == (None, view.granted), uid
            assert not any(isinstance(item.event, LeaseExpired) for item in logged), uid
            granted += view.granted
            renewed += sum(isinstance(item.event, LeaseRenewed) for item in logged)
        assert granted == acquired
        assert renewed > 0
        for api in (first, second):
            async with httpx.AsyncClient(base_url=api) as client:
                answer = await client.get("/v1/leases", params={"holder": HOLDER})
            assert answer.json() == {"items": [], "continue": "", "total": 0}


@pytest.mark.parametrize(
    "case",
    [(12, 1, False), (50, 3, False), (50, 3, True)],
    ids=["12-pages-1-proxy", "50-pages-3-proxies", "50-pages-3-proxies-blocking"],
)
async def test_a_crawl_with_more_concurrency_than_matching_proxies_fetches_every_page(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    tmp_path: Path,
    case: tuple[int, int, bool],
) -> None:
    """The middleware's defaults (a pool of 8, Scrapy's 16 requests at a time) over fewer
    matching proxies: the requests beyond the fleet wait for the pool's own leases, so every page
    is fetched, every matching proxy carries some, and none waits out the acquire timeout (which
    failed 4 of 5 pages after 60 s before). Every fifth page is in a session, through one proxy."""
    pages, matching, blocking = case  # pages, proxies matching the selector, the site blocks
    uids = [f"crawl-{i}" for i in range(matching)]
    other = "crawl-elsewhere"
    async with (
        tagged_squids(tmp_path / "squids", [*uids, other]) as squids,
        discovery(nats_server.url) as (_, api),
    ):
        for squid in squids:
            country = "fr" if squid.uid == other else "de"
            await ready_proxy(jetstream_store, squid.uid, {"country": country}, port=squid.port)
        await until(partial(available_count, api, matching + 1), what="every proxy available")

        with crawl_site(pages, block=blocking) as site:
            stats = await crawl(site.url, api, "--flat", str(pages), "--selector", SELECTOR)
            visits = list(site.visits)

    fetched = sorted(v.path for v in visits if v.status == 200)
    assert fetched == sorted(f"/page/{i}" for i in range(pages))
    assert stats["item_scraped_count"] == pages
    assert "egress/outcome/failed" not in stats
    carried = {v.proxy for v in visits if v.status == 200}
    assert carried == set(uids) - {site.blocked}
    # A lease carries up to 8 requests at once (Scrapy's per-slot concurrency): the blocked proxy
    # carries those in flight when the block came, each retried elsewhere, and no later one.
    refused = [(v.proxy, v.status) for v in visits if v.status != 200]
    assert set(refused) == ({(site.blocked, 403)} if blocking else set())
    assert len(refused) <= 8
    assert stats.get("egress/reports/blocked", 0) == int(blocking)
    session = {
        v.proxy
        for v in visits
        if v.status == 200 and page_number(v.path) % SESSION_EVERY == 0 and v.path != "/page/0"
    }
    assert len(session) == 1, session
    assert stats["egress/leases/released"] == stats["egress/leases/acquired"]


SELECTOR = json.dumps({"country": "de"})


async def available_count(api: str, count: int) -> bool:
    async with httpx.AsyncClient(base_url=api) as client:
        items = (await client.get("/v1/proxies")).json()["items"]
    return sum(1 for p in items if p["available"]) == count
