"""kill -9 of a gateway replica mid-crawl loses only the requests in flight on it: the session
lives on as its lease, and the other replica adopts it, on the same proxy (docs/gateway.md,
"Sessions"). The replicas are real ``egress-proxies run gateway`` processes."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.crawl_site import crawl_site
from tests.support.crawl_squid import tagged_squids
from tests.support.discovery import discovery, ready_proxy
from tests.support.gateway import gateway_clients, gateway_process, proxy_url

pytestmark = pytest.mark.reliability

UIDS = ["k1", "k2", "k3"]


async def test_a_killed_replica_loses_only_its_requests_in_flight(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    clients = gateway_clients(tmp_path / "clients.yaml")
    user = "crawler-a-session-survivor"
    with crawl_site(512, block=False) as site:
        async with (
            tagged_squids(tmp_path / "squids", UIDS) as squids,
            discovery(nats_server.url, clients_file=clients) as (_, api),
        ):
            for squid in squids:
                await ready_proxy(jetstream_store, squid.uid, port=squid.port)
            async with (
                gateway_process(nats_server.url, api, clients) as (first_pid, first),
                gateway_process(nats_server.url, api, clients) as (_, second),
            ):
                to_first = httpx.AsyncClient(proxy=proxy_url(first, user), timeout=10)
                to_second = httpx.AsyncClient(proxy=proxy_url(second, user), timeout=10)
                async with to_first, to_second:
                    before = [await to_first.get(f"{site.url[:-1]}{n}") for n in range(5)]
                    assert {a.status_code for a in before} == {200}
                    # Requests in flight on the first replica when it is killed.
                    flying = [
                        asyncio.create_task(to_first.get(f"{site.url[:-1]}{n}"))
                        for n in range(5, 25)
                    ]
                    await asyncio.sleep(0)
                    os.kill(first_pid, signal.SIGKILL)
                    landed = await asyncio.gather(*flying, return_exceptions=True)
                    after = [await to_second.get(f"{site.url[:-1]}{n}") for n in range(25, 45)]
    assert {a.status_code for a in after} == {200}, [a.text for a in after]
    lost = [r for r in landed if isinstance(r, BaseException)]
    answered = [r for r in landed if not isinstance(r, BaseException)]
    assert all(r.status_code == 200 for r in answered)
    assert len(lost) + len(answered) == 20
    # Every request the site saw came through one proxy: the session survived the kill.
    assert len({v.proxy for v in site.visits}) == 1, site.visits
    assert {a.headers["x-egress-lease"] for a in [*before, *after]} == {
        before[0].headers["x-egress-lease"]
    }
