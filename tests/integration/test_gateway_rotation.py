"""A rotation under a gateway session is invisible to the crawler: the gateway follows the lease
to the replacement's URL before the old instance is deleted, and no request fails
(docs/gateway.md, "When a proxy changes under a lease"). The whole system with real Squids."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.rotation import instances, rotating_up
from tests.support.waiting import until

pytestmark = pytest.mark.integration


async def test_a_session_keeps_working_through_a_rotation_of_its_proxy(tmp_path: Path) -> None:
    async with rotating_up(tmp_path) as (up, target):
        proxy = f"http://crawl-session-s1:@127.0.0.1:{up.gateway_port}"
        statuses: list[int | str] = []
        leases: set[str] = set()
        stopped = asyncio.Event()

        async def crawl() -> None:
            async with httpx.AsyncClient(proxy=proxy, timeout=10, trust_env=False) as http:
                while not stopped.is_set():
                    try:
                        answer = await http.get(target)
                    except httpx.HTTPError as exc:
                        statuses.append(repr(exc))
                    else:
                        statuses.append(answer.status_code)
                        leases.add(answer.headers.get("x-egress-lease", ""))
                    await asyncio.sleep(0.05)

        crawling = asyncio.create_task(crawl())
        try:
            await until(lambda: len(statuses) >= 5, timeout=30, what="the first requests")
            [lease_id] = leases
            [old_instance] = instances(up)
            status, before = await up.api_call("GET", f"/v1/leases/{lease_id}")
            assert status == 200, before
            status, rotation = await up.api_call("POST", f"/v1/leases/{lease_id}/rotate")
            assert status == 202, rotation

            async def switched() -> dict[str, Any] | None:
                status, now = await up.api_call("GET", f"/v1/leases/{lease_id}")
                assert status == 200, now
                return now if now["fencingToken"] > before["fencingToken"] else None

            await until(switched, timeout=90, what="the lease switched")
            await until(lambda: old_instance not in instances(up), timeout=60, what="old gone")
            served = len(statuses)
            await until(lambda: len(statuses) >= served + 10, timeout=30, what="more requests")
        finally:
            stopped.set()
            await crawling
    assert [s for s in statuses if s != 200] == [], statuses
    assert leases == {lease_id}, "one session, one lease, whatever its instance"
