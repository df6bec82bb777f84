"""The Scrapy middleware's lease pool against a real discovery replica: which lease a request is
lent, when the pool lets one go for another, and how a session gets its proxy back."""

from __future__ import annotations

import asyncio

import pytest

from egress_proxies_client import AsyncClient, NoProxyAvailable
from egress_proxies_client._pool import LeasePool, PoolClosed
from egress_proxies_client.scrapy import selector_setting
from tests.client.conftest import ATTRIBUTES, UIDS

pytestmark = pytest.mark.integration


def pool(client: AsyncClient, size: int, acquire_timeout: float = 10.0) -> LeasePool:
    return LeasePool(
        client, selector=ATTRIBUTES, ttl=30, size=size, acquire_timeout=acquire_timeout
    )


async def held_uids(client: AsyncClient) -> list[str]:
    return sorted(lease.proxy.uid for lease in await client.list_mine())


async def test_a_blocked_host_gets_another_proxy_and_a_session_gets_its_own_back(
    api: str,
) -> None:
    async with AsyncClient(api, holder="pool") as client:
        leases = pool(client, size=1)
        first = await leases.borrow("shop.example", session="cart")
        await leases.give_back(first)
        # Another host is lent the same lease: it suits, and the pool is full.
        again = await leases.borrow("news.example")
        assert again is first
        await leases.give_back(again)

        # The shop blocks it: the only lease suits no request to the shop any more, so it is
        # released for one on the other proxy, asked for without the blocked one.
        leases.block("shop.example", first.uid, session=None)
        other = await leases.borrow("shop.example")
        assert other.uid != first.uid
        assert await held_uids(client) == [other.uid]
        await leases.give_back(other)

        # The session's requests go through its proxy: leased again by its uid.
        resumed = await leases.borrow("news.example", session="cart")
        assert resumed.uid == first.uid
        assert await held_uids(client) == [first.uid]
        # ... unless the session's host blocked it: then the session moves to another proxy.
        await leases.give_back(resumed)
        moved = await leases.borrow("shop.example", session="cart")
        assert moved.uid == other.uid
        assert leases.sessions == {"cart": other.uid}
        await leases.give_back(moved)

        await leases.close()
        assert await client.list_mine() == []
        with pytest.raises(PoolClosed):
            await leases.borrow("shop.example")


async def test_requests_of_a_new_session_all_go_through_its_first_proxy(api: str) -> None:
    async with AsyncClient(api, holder="pool-session") as client:
        leases = pool(client, size=2)
        # Both arrive before the session has a proxy: the second waits for the first's lease
        # instead of leasing the other proxy for the same session.
        first = asyncio.create_task(leases.borrow("shop.example", session="cart"))
        second = asyncio.create_task(leases.borrow("shop.example", session="cart"))
        lent = await first
        await asyncio.sleep(0.3)
        assert not second.done()
        await leases.give_back(lent)
        assert await second is lent
        assert await held_uids(client) == [lent.uid]
        await leases.give_back(lent)
        await leases.close()


async def test_a_request_waits_for_a_lease_to_come_back(api: str) -> None:
    async with AsyncClient(api, holder="pool-wait") as client:
        leases = pool(client, size=3, acquire_timeout=10.0)
        held = [await leases.borrow("shop.example") for _ in UIDS]
        assert sorted(p.uid for p in held) == sorted(UIDS)
        # The pool has room, but the API has no third proxy: the request waits for a lease of
        # the pool, and gets the first one given back.
        waiting = asyncio.create_task(leases.borrow("shop.example"))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await leases.give_back(held[1])
        assert await waiting is held[1]
        for pooled in (held[0], held[1]):
            await leases.give_back(pooled)
        await leases.close()
        assert await client.list_mine() == []


async def crawl(
    leases: LeasePool, requests: int, host: str, session: str | None = None
) -> list[str]:
    """``requests`` requests at once, each holding its lease a moment; the uids they went
    through."""

    async def one() -> str:
        pooled = await leases.borrow(host, session)
        await asyncio.sleep(0.02)
        await leases.give_back(pooled)
        return pooled.uid

    return list(await asyncio.gather(*(one() for _ in range(requests))))


@pytest.mark.parametrize("session", [None, "cart"])
async def test_more_requests_than_proxies_are_served_by_the_pools_own_leases(
    api: str, session: str | None
) -> None:
    """A pool larger than the fleet (8 leases, 2 proxies): the requests beyond the fleet wait
    for the pool's own leases, not for the API to free a proxy the pool itself holds (which it
    never would before the acquire timeout, so they failed)."""
    async with AsyncClient(api, holder="pool-starve") as client:
        leases = pool(client, size=8, acquire_timeout=20.0)
        used = await crawl(leases, 12, "shop.example", session)
        assert len(used) == 12
        assert set(used) == ({used[0]} if session else set(UIDS))
        # Blocked: the shop's requests go through the other proxy alone, and still all pass.
        leases.block("shop.example", UIDS[0], session)
        assert set(await crawl(leases, 12, "shop.example", session)) == {UIDS[1]}
        await leases.close()
        # A spare acquire cancelled at close may have been granted meanwhile: the middleware
        # releases what its holder still has after the pool (D97), and so does this.
        await client.release_mine()
        assert await client.list_mine() == []


async def test_a_request_that_gets_no_lease_in_time_fails(api: str) -> None:
    async with AsyncClient(api, holder="pool-timeout") as client:
        leases = pool(client, size=2, acquire_timeout=0.5)
        held = [await leases.borrow("shop.example") for _ in UIDS]
        with pytest.raises(NoProxyAvailable, match="EGRESS_ACQUIRE_TIMEOUT"):
            await leases.borrow("shop.example")
        for pooled in held:
            await leases.give_back(pooled)
        await leases.close()
        assert await client.list_mine() == []


def test_the_selector_setting_is_a_dict_or_its_json() -> None:
    assert selector_setting('{"country": "de"}') == {"country": "de"}
    assert selector_setting({"tier": "gold"}) == {"tier": "gold"}
    assert selector_setting(None) == {}
    with pytest.raises(ValueError, match="EGRESS_SELECTOR: 'country=de' is not JSON"):
        selector_setting("country=de")
    with pytest.raises(ValueError, match=r"EGRESS_SELECTOR: .* not a map of strings"):
        selector_setting({"port": 3128})
