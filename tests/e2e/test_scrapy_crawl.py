"""A real Scrapy crawl through leased proxies, against a site that blocks one of them.

Eight real Squids (the local provider's, each naming itself to the site), Ready and healthy in the
log; two discovery replicas on a real nats-server; a local site of 200 pages that answers 403 to
whatever comes through one of the proxies. The crawl (tests/support/crawl_spider.py, in its own
process) leases a proxy per request with the request's host as ``target``, reports ``blocked`` on
a 403 and fetches the page again through another proxy.

What the contract guarantees, and so what is asserted: a lease holds its proxy exclusively, the
crawler reports before it releases, and once a ``blocked`` report for (proxy, host) is in the log
no claim naming that host holds on that proxy during the back-off (10 minutes, far longer than the
crawl). So the blocked proxy carries exactly one request to the site, the one it was blocked on,
however many requests are in flight; every page is fetched once, with 200; and every lease ends
released, none left to expire.
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
from events.schemas import AnyEvent, LeaseAcquired, LeaseExpired, LeaseReleased, LeaseReported
from events.store import Unreadable
from projections import lease as lease_fold
from projections.lease import LeaseView
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.natsserver import EmbeddedNatsServer
from tests.support.crawl_site import crawl_site
from tests.support.crawl_squid import tagged_squids
from tests.support.discovery import discovery, ready_proxy
from tests.support.system import ROOT
from tests.support.waiting import until

pytestmark = pytest.mark.e2e

PAGES = 200
UIDS = [f"crawl-{i}" for i in range(8)]
BLOCKED = UIDS[0]
HOST = "127.0.0.1"
HOLDER = "scrapy-e2e"
CRAWL_TIMEOUT = 60.0


async def all_available(api: str) -> bool:
    async with httpx.AsyncClient(base_url=api) as client:
        items = (await client.get("/v1/proxies")).json()["items"]
    return sorted(p["uid"] for p in items if p["available"]) == sorted(UIDS)


async def crawl(start: str, apis: list[str]) -> dict[str, Any]:
    """Run the crawl to its end; its stats."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.crawl_spider",
        "--start",
        start,
        *(arg for api in apis for arg in ("--api", api)),
        "--holder",
        HOLDER,
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


async def lease_log(store: JetStreamEventStore, uid: str) -> tuple[list[Logged], LeaseView]:
    """The proxy's lease events in order, and the fold of them all."""
    view: LeaseView | None = None
    logged = []
    for recorded in (await store.read(subjects.lease(uid))).events:
        before = view.granted if view else 0
        view = lease_fold.apply(view, recorded)
        logged.append(Logged(recorded.event, view.granted > before))
    assert view is not None, f"{uid} was never leased"
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

        with crawl_site(PAGES, blocked=BLOCKED) as site:
            stats = await crawl(site.url, [first, second])
            visits = list(site.visits)

        # The site: every page once, with 200, through a proxy; the blocked one carried exactly
        # the request it was blocked on.
        fetched = sorted(v.path for v in visits if v.status == 200)
        assert fetched == sorted(f"/page/{i}" for i in range(PAGES))
        assert {v.proxy for v in visits if v.status == 200} <= set(UIDS) - {BLOCKED}
        assert [(v.proxy, v.status) for v in visits if v.status != 200] == [(BLOCKED, 403)]
        # The crawler's side of it.
        assert stats["item_scraped_count"] == PAGES
        assert (stats["leases/success"], stats["leases/blocked"]) == (PAGES, 1)
        assert "leases/failed" not in stats
        assert stats["leases/released_at_close"] == 0  # each was released after its request

        # The log: one claim ever held on the blocked proxy, naming the host; then its one report,
        # blocked; no claim held after that.
        logged, _ = await lease_log(jetstream_store, BLOCKED)
        held = [item.event for item in logged if item.granted]
        assert len(held) == 1
        assert isinstance(held[0], LeaseAcquired)
        assert held[0].target == HOST
        reports = [item.event for item in logged if isinstance(item.event, LeaseReported)]
        assert [(r.outcome, r.target) for r in reports] == [("blocked", HOST)]
        reported = next(i for i, item in enumerate(logged) if item.event is reports[0])
        assert not any(item.granted for item in logged[reported:])

        # Every lease released, none left to expire: in the log and on both replicas.
        for uid in UIDS:
            logged, view = await lease_log(jetstream_store, uid)
            releases = sum(isinstance(item.event, LeaseReleased) for item in logged)
            assert (view.current, releases) == (None, view.granted), uid
            assert not any(isinstance(item.event, LeaseExpired) for item in logged), uid
        for api in (first, second):
            async with httpx.AsyncClient(base_url=api) as client:
                answer = await client.get("/v1/leases", params={"holder": HOLDER})
            assert answer.json() == {"items": []}
