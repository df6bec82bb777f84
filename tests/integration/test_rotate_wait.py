"""Waiting for a rotation on the whole system with real Squids (the local provider): the client
library's held lease ``rotate()`` returns once the lease has switched, with the new URL taken
before the old instance is deleted, so a crawler that sends every request through ``lease.url``
never sees one fail; ``egress-proxies lease rotate --wait`` exits 0 with the switched lease
(docs/api.md; docs/decisions/0085-a-fresh-ip-without-downtime.md and D88)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from egress_proxies_client import AsyncClient, AsyncHeldLease
from tests.support.rotation import Requests, instances, rotating_up
from tests.support.system import fetch_via
from tests.support.waiting import until

pytestmark = pytest.mark.integration


class Crawler(Requests):
    """Sends request after request through ``held.url``, read afresh for each, as the client
    library's documentation asks."""

    def __init__(self, held: AsyncHeldLease, target: str) -> None:
        super().__init__(target)
        self.held = held

    async def run(self) -> None:
        while not self.stopped:
            await self.through(self.held.url)
            await asyncio.sleep(0.02)


async def test_a_held_lease_rotates_without_a_failed_request(tmp_path: Path) -> None:
    async with rotating_up(tmp_path) as (up, target):
        [old_instance] = instances(up)
        async with AsyncClient(up.api) as client, client.lease({"country": "de"}, 300) as held:
            before = held.lease
            crawler = Crawler(held, target)
            running = asyncio.create_task(crawler.run())
            await until(lambda: len(crawler.ok) >= 3, timeout=30)

            rotation = await held.rotate(timeout=120)
            assert rotation.state == "completed"
            assert held.url == rotation.lease.proxy.url != before.proxy.url
            assert held.lease.fencing_token > before.fencing_token
            new_url = held.url
            # Past the drain: the old instance is gone while the crawler keeps sending.
            await until(lambda: old_instance not in instances(up), timeout=60)
            sent = len(crawler.ok)
            await until(lambda: len(crawler.ok) >= sent + 3, timeout=30)
            crawler.stopped = True
            await running
            assert crawler.failed == []
            assert before.proxy.url in crawler.ok
            assert crawler.ok[-1] == new_url

            by_cli = await up.cli(
                *("lease", "rotate", held.id, "--wait", "--timeout", "2m"),
                *("--api-url", up.api, "-o", "json"),
            )
            assert by_cli.returncode == 0, by_cli.stdout + by_cli.stderr
            done = json.loads(by_cli.stdout)
            assert done["state"] == "completed"
            assert done["rotationId"] != rotation.id
            assert done["lease"]["fencingToken"] > held.lease.fencing_token
            moved = done["lease"]["proxy"]["url"]
            assert moved != new_url
            body = await asyncio.to_thread(fetch_via, moved, target)
            assert body == "hello through the proxy"

        status, error = await up.api_call("GET", f"/v1/leases/{held.id}/rotation")
        assert (status, error["error"]) == (404, "unknown_lease")  # released
