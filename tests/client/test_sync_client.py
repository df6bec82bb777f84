"""The blocking client against a real discovery replica. It runs on a thread of its own here,
since the replica serves from the test's event loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from egress_proxies_client import Client, NoMatchingProxy, NoProxyAvailable, UnknownLease
from tests.client.conftest import ATTRIBUTES, UIDS

pytestmark = pytest.mark.integration


def hold_past_the_ttl(api: str) -> None:
    with Client(api, holder="sync") as client:
        with client.lease(ATTRIBUTES, 1.0, target="shop.example") as held:
            first = held.lease
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                assert client.get(held.id).fencing_token == first.fencing_token
                time.sleep(0.25)
            assert held.lost is None
            assert held.lease.renewed_at is not None
            held.report_blocked(detail="HTTP 403")
            assert [(r.outcome, r.target) for r in client.get(held.id).reports] == [
                ("blocked", "shop.example")
            ]
            with client.lease(ATTRIBUTES, 30) as other:
                assert {held.proxy.uid, other.proxy.uid} == set(UIDS)
                with pytest.raises(NoProxyAvailable) as caught:
                    client.acquire(ATTRIBUTES, 30)
                assert caught.value.retry_after >= 1
        with pytest.raises(UnknownLease):
            client.get(first.id)
        assert client.list_mine() == []
        with pytest.raises(NoMatchingProxy):
            client.acquire({"country": "fr"})


def release_on_error(api: str) -> str:
    with Client(api, holder="sync-raiser") as client:
        try:
            with client.lease(ATTRIBUTES, 60) as held:
                raise KeyError(held.id)
        except KeyError as exc:
            lease_id = str(exc.args[0])
        with pytest.raises(UnknownLease):
            client.get(lease_id)
        # A holder's leases, released in one call: none left here.
        client.acquire(ATTRIBUTES, 60)
        assert client.release_mine() == 1
        return lease_id


async def test_the_sync_client_renews_reports_and_releases(api: str) -> None:
    await asyncio.to_thread(hold_past_the_ttl, api)


async def test_the_sync_client_releases_when_the_block_raises(api: str) -> None:
    assert await asyncio.to_thread(release_on_error, api)
