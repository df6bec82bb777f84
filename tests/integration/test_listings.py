"""``GET /v1/proxies`` and ``GET /v1/leases?holder=`` page on a real discovery replica: a
``limit``, an opaque ``continue`` and a ``total``; a key cursor, so proxies added and removed
between pages move no other; hostile paging parameters are a 400 naming the field and the fix."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from events import subjects
from events.schemas import ProxyRemoved
from events.store import NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

UIDS = [f"u{i:02d}" for i in range(12)]


@pytest.fixture
async def api(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> AsyncIterator[httpx.AsyncClient]:
    for i, uid in enumerate(UIDS):
        # Names in another order than uids; two namespaces.
        namespace = "a" if i % 3 else "b"
        await ready_proxy(
            jetstream_store,
            uid,
            {"tier": "gold" if i % 2 else "silver"},
            namespace=namespace,
            name=f"n{(7 * i) % 12:02d}",
        )
    async with (
        discovery(nats_server.url) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):

        async def seen() -> bool:
            return bool((await client.get("/v1/proxies")).json()["total"] == len(UIDS))

        await until(seen, what="every proxy in the view")
        yield client


async def _pages(client: httpx.AsyncClient, path: str, **params: Any) -> list[dict[str, Any]]:
    pages = []
    token = ""
    while True:
        query = {**params, **({"continue": token} if token else {})}
        got = await client.get(path, params=query)
        assert got.status_code == 200, got.text
        pages.append(got.json())
        token = got.json()["continue"]
        if not token:
            return pages


def _keys(items: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(p["namespace"], p["name"], p["uid"]) for p in items]


async def test_pages_cover_the_listing_once_in_order_with_a_total(
    api: httpx.AsyncClient,
) -> None:
    whole = (await api.get("/v1/proxies")).json()
    assert whole["continue"] == ""
    assert whole["total"] == len(UIDS)
    expected = _keys(whole["items"])
    assert expected == sorted(expected)
    assert len(expected) == len(UIDS)

    pages = await _pages(api, "/v1/proxies", limit="5")
    assert [len(p["items"]) for p in pages] == [5, 5, 2]
    assert all(p["total"] == len(UIDS) for p in pages)
    assert [k for p in pages for k in _keys(p["items"])] == expected

    gold = await _pages(api, "/v1/proxies", limit="4", **{"attr.tier": "gold"})
    got = [k for p in gold for k in _keys(p["items"])]
    assert len(got) == 6
    assert got == [k for k in expected if int(k[2][1:]) % 2]
    assert [p["total"] for p in gold] == [6, 6]


async def test_a_cursor_is_stable_while_proxies_come_and_go(
    api: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    first = (await api.get("/v1/proxies", params={"limit": "6"})).json()
    seen = _keys(first["items"])
    # One proxy already shown goes; one sorting before the cursor and one after it come.
    gone = seen[0][2]
    await jetstream_store.append(
        subjects.proxy(gone), [NewEvent(ProxyRemoved(uid=gone), f"rm-{gone}")]
    )
    await ready_proxy(jetstream_store, "early", namespace="a", name="a-first")
    await ready_proxy(jetstream_store, "late", namespace="zz", name="last")

    async def moved() -> bool:
        return bool((await api.get("/v1/proxies")).json()["total"] == len(UIDS) + 1)

    await until(moved, what="the changes in the view")
    rest = await _pages(api, "/v1/proxies", limit="6", **{"continue": first["continue"]})
    after = [k for p in rest for k in _keys(p["items"])]
    assert after == sorted(after)
    assert after[0] > seen[-1]
    assert ("zz", "last", "late") in after
    assert all(k[2] != "early" for k in after)
    assert len(seen) + len(after) == len(UIDS) + 1  # the 12 of the first view, less one, plus late


@pytest.mark.parametrize(
    "limit", ["0", "-1", "1001", "abc", "1e3", "", " ", "٣", "9" * 400, "<b>5</b>", "5.0"]
)
async def test_a_bad_limit_is_a_400_naming_it(api: httpx.AsyncClient, limit: str) -> None:
    got = await api.get("/v1/proxies", params={"limit": limit})
    assert got.status_code == 400, got.text
    assert got.json()["error"] == "invalid_request"
    assert "limit" in got.json()["message"]
    assert "1 to 1000" in got.json()["message"]
    leases = await api.get("/v1/leases", params={"holder": "h", "limit": limit})
    assert leases.status_code == 400
    assert "limit" in leases.json()["message"]


async def test_a_foreign_or_broken_token_is_invalid_continue(api: httpx.AsyncClient) -> None:
    token = (await api.get("/v1/proxies", params={"limit": "2"})).json()["continue"]
    assert token
    other_filters = await api.get(
        "/v1/proxies", params={"limit": "2", "continue": token, "phase": "Ready"}
    )
    lease_listing = await api.get("/v1/leases", params={"holder": "h", "continue": token})
    broken = [
        "garbage",
        "%%%",
        "AQ",
        token[:-3],
        "A" * 5000,
        "<script>x</script>",
        "ÿþ",
        "AXsiYSI6MX0",  # version 1, a JSON object instead of the array
        "AlsiYSIsW11d",  # an unknown version
    ]
    for answer in [other_filters, lease_listing] + [
        await api.get("/v1/proxies", params={"continue": bad}) for bad in broken
    ]:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"] == "invalid_continue"
        assert "start the listing again" in answer.json()["message"]
    twice = await api.get("/v1/proxies?limit=1&limit=2")
    assert twice.status_code == 400
    assert "once" in twice.json()["message"]


async def test_a_holders_leases_page_oldest_first(api: httpx.AsyncClient) -> None:
    granted = []
    for _ in range(5):
        got = await api.post("/v1/leases", json={"holder": "pager", "ttlSeconds": 600})
        assert got.status_code == 201, got.text
        granted.append(got.json()["id"])

    async def all_listed() -> bool:
        got = await api.get("/v1/leases", params={"holder": "pager"})
        return bool(got.json()["total"] == len(granted))

    await until(all_listed, what="the holder's leases")
    whole = (await api.get("/v1/leases", params={"holder": "pager"})).json()
    pages = await _pages(api, "/v1/leases", holder="pager", limit="2")
    assert [len(p["items"]) for p in pages] == [2, 2, 1]
    assert [lease["id"] for p in pages for lease in p["items"]] == [
        lease["id"] for lease in whole["items"]
    ]
    assert sorted(lease["id"] for lease in whole["items"]) == sorted(granted)
    other_holder = await api.get(
        "/v1/leases", params={"holder": "other", "continue": pages[0]["continue"]}
    )
    assert other_holder.status_code == 400
    assert other_holder.json()["error"] == "invalid_continue"
