"""``POST /v1/leases/{id}/rotate`` on the whole system with real Squids (the local provider):
a holder's requests through its lease keep succeeding while the proxy gets a fresh instance,
the lease switches with a higher fencing token, and the old instance is gone afterwards
(docs/api.md; docs/decisions/0085-a-fresh-ip-without-downtime.md)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.rotation import Requests, instances, rotating_up
from tests.support.system import Up, processes_mentioning
from tests.support.waiting import until

pytestmark = pytest.mark.integration


class Holder(Requests):
    """A crawler that reads its lease before every request, as the client library does when
    the fencing token moves, and sends the request through the lease's proxy."""

    def __init__(self, up: Up, lease_id: str, target: str) -> None:
        super().__init__(target)
        self.up, self.lease_id = up, lease_id

    async def run(self) -> None:
        while not self.stopped:
            status, lease = await self.up.api_call("GET", f"/v1/leases/{self.lease_id}")
            assert status == 200, lease
            await self.through(lease["proxy"]["url"])
            await asyncio.sleep(0.05)


async def test_a_rotation_moves_the_lease_without_a_failed_request(tmp_path: Path) -> None:
    async with rotating_up(tmp_path) as (up, target):
        status, lease = await up.api_call(
            "POST", "/v1/leases", {"selector": {"country": "de"}, "ttlSeconds": 300}
        )
        assert status == 201, lease
        [old_instance] = instances(up)
        holder = Holder(up, lease["id"], target)
        running = asyncio.create_task(holder.run())
        await until(lambda: len(holder.ok) >= 5, timeout=30)

        status, rotation = await up.api_call("POST", f"/v1/leases/{lease['id']}/rotate")
        assert status == 202, rotation
        assert rotation["state"] in ("requested", "creating")
        assert rotation["lease"]["fencingToken"] == lease["fencingToken"]
        status, again = await up.api_call("POST", f"/v1/leases/{lease['id']}/rotate")
        assert status == 202, again
        assert again["rotationId"] == rotation["rotationId"]  # the one under way

        async def switched() -> dict[str, Any] | None:
            status, now = await up.api_call("GET", f"/v1/leases/{lease['id']}")
            assert status == 200, now
            return now if now["fencingToken"] > lease["fencingToken"] else None

        try:
            await until(switched, timeout=90, what="the lease switched")
        except AssertionError as exc:  # seen once on two busy workers: keep what up said
            raise AssertionError(f"{exc}; up said:\n{up.output.decode()[-8000:]}") from exc
        after = await switched()
        assert after is not None
        assert after["proxy"]["url"] != lease["proxy"]["url"]

        async def old_gone() -> bool:
            return old_instance not in instances(up)

        await until(old_gone, timeout=60)
        started = time.monotonic()
        await until(lambda: time.monotonic() - started > 1 and len(holder.ok) > 0)
        holder.stopped = True
        await running

        assert holder.failed == []
        assert lease["proxy"]["url"] in holder.ok
        assert after["proxy"]["url"] == holder.ok[-1]
        assert len(instances(up)) == 1
        old_dir = str((up.data_dir / "local" / "instances" / old_instance).resolve())
        assert processes_mentioning(old_dir) == []
        [proxy] = await up.proxies()
        assert proxy["phase"] == "Ready"

        by_cli = await up.cli("lease", "rotate", lease["id"], "--api-url", up.api, "-o", "json")
        assert by_cli.returncode == 0, by_cli.stdout + by_cli.stderr
        done = json.loads(by_cli.stdout)
        assert done["rotationId"] != rotation["rotationId"]  # the first one is over
        assert done["lease"]["id"] == lease["id"]

        status, error = await up.api_call("POST", "/v1/leases/no-such-lease/rotate")
        assert (status, error["error"]) == (404, "unknown_lease")
        released = await up.cli("lease", "release", lease["id"], "--api-url", up.api)
        assert released.returncode == 0, released.stdout + released.stderr
        status, error = await up.api_call("POST", f"/v1/leases/{lease['id']}/rotate")
        assert (status, error["error"]) == (404, "unknown_lease")
        status, short = await up.api_call(
            "POST", "/v1/leases", {"selector": {"country": "de"}, "ttlSeconds": 1}
        )
        assert status == 201, short

        async def expired() -> bool:
            status, _ = await up.api_call("GET", f"/v1/leases/{short['id']}")
            return status == 404  # docs/api.md: an expired lease is unknown_lease

        await until(expired, timeout=10, what="the one-second lease expired")
        status, error = await up.api_call("POST", f"/v1/leases/{short['id']}/rotate")
        assert (status, error["error"]) == (404, "unknown_lease")  # expired
        deleted = await up.cli("delete", "crawl/rot-1", "--wait")
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    instances_dir = (tmp_path / "data" / "local" / "instances").resolve()
    assert processes_mentioning(str(instances_dir)) == []  # the replacements too
