"""``list_mine`` follows the listing's ``continue`` token, in the async and the blocking client,
so a holder's leases come a page at a time and all of them arrive once, oldest first."""

from __future__ import annotations

import asyncio

import pytest

from egress_proxies_client import AsyncClient, Client, EgressError
from tests.client.conftest import ATTRIBUTES, UIDS

pytestmark = pytest.mark.integration


async def test_list_mine_pages_through_every_lease(api: str) -> None:
    async with AsyncClient(api, holder="pager") as client:
        held = [await client.acquire(ATTRIBUTES, 60) for _ in UIDS]
        one_at_a_time = await client.list_mine(page_size=1)
        assert [lease.id for lease in one_at_a_time] == [lease.id for lease in held]
        assert [lease.id for lease in await client.list_mine()] == [lease.id for lease in held]

        def blocking() -> list[str]:
            with Client(api, holder="pager") as sync:
                return [lease.id for lease in sync.list_mine(page_size=1)]

        assert await asyncio.to_thread(blocking) == [lease.id for lease in held]
        with pytest.raises(EgressError) as caught:
            await client.list_mine(page_size=0)
        assert caught.value.code == "invalid_request"
        assert "limit" in str(caught.value)
        assert await client.release_mine() == len(UIDS)
        assert await client.list_mine(page_size=1) == []
