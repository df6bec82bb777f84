"""The async client against a real discovery replica: leases held, renewed and released, and
every error answer arriving as the exception that names it."""

from __future__ import annotations

import asyncio
import re
from urllib.parse import urlsplit

import pytest

from egress_proxies_client import (
    AsyncClient,
    AsyncHeldLease,
    AuthError,
    NoMatchingProxy,
    NoProxyAvailable,
    Unavailable,
    UnknownLease,
)
from services.runtime.ports import free_port
from tests.client.conftest import ATTRIBUTES, TOKEN, UIDS, available
from tests.client.relay import lossy_relay

pytestmark = pytest.mark.integration


async def test_a_held_lease_is_renewed_in_the_background_until_it_is_released(api: str) -> None:
    async with AsyncClient(api, holder="renewer") as client:
        async with client.lease(ATTRIBUTES, 1.0, target="shop.example") as held:
            first = held.lease
            assert first.proxy.uid in UIDS
            assert held.url == first.proxy.url == "http://127.0.0.1:3128"
            # Past three of its 1 s TTLs, the lease is still held: renewed, never re-acquired.
            end = asyncio.get_running_loop().time() + 3.5
            while asyncio.get_running_loop().time() < end:
                seen = await client.get(held.id)
                assert (seen.id, seen.fencing_token) == (first.id, first.fencing_token)
                await asyncio.sleep(0.25)
            assert held.lost is None
            assert held.lease.renewed_at is not None
            assert (held.lease.expires_at - first.expires_at).total_seconds() >= 2
            assert [lease.id for lease in await client.list_mine()] == [first.id]
        with pytest.raises(UnknownLease):
            await client.get(first.id)
        assert await client.list_mine() == []


async def fail_inside(held: AsyncHeldLease) -> None:
    async with held:
        raise RuntimeError("crawl failed")


async def test_a_lease_is_released_when_the_block_raises(api: str) -> None:
    async with AsyncClient(api, holder="raiser") as client:
        held = client.lease(ATTRIBUTES, 60)
        with pytest.raises(RuntimeError, match="crawl failed"):
            await fail_inside(held)
        lease_id = held.id
        with pytest.raises(UnknownLease) as caught:
            await client.get(lease_id)
        assert (caught.value.status, caught.value.code) == (404, "unknown_lease")
        assert await client.list_mine() == []
        assert await available(api) == len(UIDS)


async def test_reports_name_the_leases_target_unless_told_otherwise(api: str) -> None:
    async with AsyncClient(api) as client, client.lease(target="shop.example") as held:
        await held.report_success()
        await held.report_blocked(detail="HTTP 403")
        await held.report_failed("other.example", "reset")
        seen = await client.get(held.id)
    assert [(r.outcome, r.target, r.detail) for r in seen.reports] == [
        ("success", "shop.example", ""),
        ("blocked", "shop.example", "HTTP 403"),
        ("failed", "other.example", "reset"),
    ]


async def test_no_matching_proxy_is_a_422_that_names_what_exists(api: str) -> None:
    async with AsyncClient(api) as client:
        with pytest.raises(NoMatchingProxy) as caught:
            await client.acquire({"contry": "de"}, 60)
        # Every proxy excluded is the same answer: waiting would not help.
        with pytest.raises(NoMatchingProxy):
            await client.acquire(ATTRIBUTES, 60, exclude=UIDS)
    assert caught.value.status == 422
    assert "country" in caught.value.message


async def test_no_proxy_available_is_a_503_with_the_time_to_wait(api: str) -> None:
    async with AsyncClient(api, holder="greedy") as client:
        async with client.lease(ATTRIBUTES, 30), client.lease(ATTRIBUTES, 30):
            with pytest.raises(NoProxyAvailable) as caught:
                await client.acquire(ATTRIBUTES, 30)
            # Held by the API for ``wait`` seconds, then the same answer.
            with pytest.raises(NoProxyAvailable):
                await client.acquire(ATTRIBUTES, 30, wait=0.5)
            assert len(await client.list_mine()) == 2
        assert await client.list_mine() == []
    assert caught.value.status == 503
    assert 1 <= caught.value.retry_after <= 30


async def test_a_lease_that_is_over_is_an_unknown_lease(api: str) -> None:
    async with AsyncClient(api) as client:
        lease = await client.acquire(ATTRIBUTES, 60)
        await client.release(lease.id)
        await client.release(lease.id)  # a release is idempotent: 204 again
        for call in (
            client.get(lease.id),
            client.renew(lease.id, 60),
            client.report(lease.id, "success", target="shop.example"),
            client.release("never-issued"),
        ):
            with pytest.raises(UnknownLease):
                await call


async def test_a_wrong_or_missing_token_is_an_auth_error(guarded_api: str) -> None:
    for token in (None, "not-the-token"):
        async with AsyncClient(guarded_api, token) as client:
            with pytest.raises(AuthError) as caught:
                await client.acquire(ATTRIBUTES, 60)
            assert (caught.value.status, caught.value.code) == (401, "unauthorized")
    async with AsyncClient(guarded_api, TOKEN) as client, client.lease(ATTRIBUTES, 60) as held:
        assert held.proxy.uid in UIDS


async def test_an_acquire_whose_answer_was_lost_is_retried_into_the_same_lease(api: str) -> None:
    port = urlsplit(api).port
    assert port is not None
    async with (
        lossy_relay(port, b"POST /v1/leases ") as relay,
        AsyncClient(relay.url, holder="retrier") as client,
    ):
        lease = await client.acquire(ATTRIBUTES, 60)
        mine = await client.list_mine()
    # The first request was granted, its answer lost; the retry got that same lease.
    assert relay.lost == 1
    sent = b"".join(relay.requests)
    keys = re.findall(rb"POST /v1/leases .*?idempotency-key: ([^\r]+)", sent, re.I | re.S)
    assert len(keys) == 2
    assert keys[0] == keys[1]
    assert [m.id for m in mine] == [lease.id]
    assert await available(api) == len(UIDS) - 1


async def test_an_unreachable_api_is_unavailable_after_the_retries() -> None:
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", retries=2) as client:
        with pytest.raises(Unavailable) as caught:
            await client.acquire(ATTRIBUTES, 60)
    assert caught.value.retry_after > 0
    assert "cannot reach" in caught.value.message
