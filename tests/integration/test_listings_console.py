"""The console's fleet page in pages on a real discovery replica: server-side sort, search by
name and attribute, bounded pages with the total, a poll that sends only what changed, time
travel in pages, and hostile paging parameters refused or ignored, never echoed raw."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from urllib.parse import parse_qsl

import httpx
import pytest

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy, set_health
from tests.support.waiting import until

pytestmark = pytest.mark.integration

COUNT = 25
HOSTILE = '<script>alert("x")</script>'
UID = re.compile(r'<tr data-uid="([^"]+)"')


@pytest.fixture
async def ui(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> AsyncIterator[httpx.AsyncClient]:
    for i in range(COUNT):
        await ready_proxy(
            jetstream_store,
            f"c{i:02d}",
            {"tier": "gold" if i % 5 == 0 else "std"},
            name=f"crawler-{(i * 7) % COUNT:02d}",
            healthy=i % 4 != 0,
        )
    async with (
        discovery(nats_server.url) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=20) as client,
    ):

        async def all_there() -> bool:
            return f'of <b data-count="total">{COUNT}</b>' in (await client.get("/ui")).text

        await until(all_there, what="the whole fleet on the page")
        yield client


def _uids(html: str) -> list[str]:
    return UID.findall(html)


async def test_pages_sort_and_search_on_the_server(ui: httpx.AsyncClient) -> None:
    first = (await ui.get("/ui", params={"size": "10"})).text
    assert len(_uids(first)) == 10
    assert 'Page <b data-count="page">1</b> of 3' in first
    pages = [_uids((await ui.get("/ui", params={"size": "10", "page": n})).text) for n in (1, 2, 3)]
    every = [uid for shown in pages for uid in shown]
    assert every == sorted(every, key=lambda uid: (int(uid[1:]) * 7) % COUNT)  # by name
    assert len(set(every)) == COUNT
    beyond = (await ui.get("/ui", params={"size": "10", "page": "99"})).text
    assert _uids(beyond) == pages[2]  # past the end: the last page

    by_health = _uids((await ui.get("/ui", params={"sort": "health", "size": "50"})).text)
    unhealthy = {f"c{i:02d}" for i in range(COUNT) if i % 4 == 0}
    assert set(by_health[: len(unhealthy)]) == unhealthy  # problems first
    reverse = _uids((await ui.get("/ui", params={"sort": "health", "order": "desc"})).text)
    assert reverse == by_health[::-1]

    named = (await ui.get("/ui", params={"q": "CRAWLER-0"})).text
    assert len(_uids(named)) == 10  # crawler-00 .. crawler-09
    assert '<b data-count="shown">10</b>' in named
    gold = _uids((await ui.get("/ui", params={"attrs": "tier=gold", "q": "crawler"})).text)
    assert sorted(gold) == [f"c{i:02d}" for i in range(0, COUNT, 5)]


async def test_a_poll_sends_nothing_then_only_the_changed_row(
    ui: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    page = (await ui.get("/ui", params={"size": "10"})).text
    since = re.search(r'data-since="([^"]+)"', page)
    assert since is not None
    live = re.search(r'data-live="([^"]+)"', page)
    assert live is not None
    # httpx's params replace a URL's own query: keep the page's (its size) beside ``since``.
    path, _, query = live.group(1).replace("&amp;", "&").partition("?")
    page_query = dict(parse_qsl(query))
    assert page_query == {"size": "10"}
    polled = {**page_query, "since": since.group(1)}

    async def settled() -> bool:
        """The fixture waits for every proxy, not for every event of each: a poll may still
        carry a late verdict; its token then stands for the page as it now is."""
        got = await ui.get(path, params=polled)
        polled["since"] = got.headers.get("x-fleet-poll", polled["since"])
        return got.status_code == 204

    await until(settled, what="a poll with nothing new")
    unchanged = await ui.get(path, params=polled)
    assert unchanged.status_code == 204
    assert unchanged.content == b""
    assert unchanged.headers["x-fleet-mode"] == "nothing"

    shown = _uids(page)
    await set_health(jetstream_store, shown[3], healthy=False, latency_ms=1.0)
    token = unchanged.headers["x-fleet-poll"]

    async def changed() -> bool:
        got = await ui.get(path, params={**page_query, "since": token})
        return got.status_code == 200

    await until(changed, what="the health change in the view")
    after = await ui.get(path, params={**page_query, "since": token})
    assert after.headers["x-fleet-mode"] == "rows"
    assert _uids(after.text) == [shown[3]]  # that row alone, with the counts
    assert 'data-count="unhealthy"' in after.text
    full = await ui.get(path, params={**page_query, "since": "nonsense"})
    assert full.headers["x-fleet-mode"] == "full"
    assert _uids(full.text) == shown
    assert len(after.content) < len(full.content) / 3


async def test_a_filtered_poll_after_one_change_returns_that_row_alone(
    ui: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    """The poll reads what changed since its token, not the fleet: one proxy's new verdict is
    one row; the next poll is a 204; a token carried to another query, or one naming a version
    this replica never gave, gets that query's whole table."""
    query = {"health": "unhealthy", "size": "10"}
    page = (await ui.get("/ui", params=query)).text
    since = re.search(r'data-since="([^"]+)"', page)
    assert since is not None
    shown = _uids(page)
    assert sorted(shown) == [f"c{i:02d}" for i in range(0, COUNT, 4)]
    polled = {**query, "since": since.group(1)}

    async def settled() -> bool:
        got = await ui.get("/ui/live", params=polled)
        polled["since"] = got.headers.get("x-fleet-poll", polled["since"])
        return got.status_code == 204

    await until(settled, what="a poll with nothing new")
    token = polled["since"]
    await set_health(jetstream_store, shown[2], healthy=False, latency_ms=42.0)

    async def changed() -> bool:
        got = await ui.get("/ui/live", params={**query, "since": token})
        return got.status_code == 200

    await until(changed, what="the new verdict in the view")
    after = await ui.get("/ui/live", params={**query, "since": token})
    assert after.headers["x-fleet-mode"] == "rows"
    assert _uids(after.text) == [shown[2]]
    assert "42" in after.text
    assert f'<b data-count="shown">{len(shown)}</b>' in after.text
    newer = after.headers["x-fleet-poll"]
    quiet = await ui.get("/ui/live", params={**query, "since": newer})
    assert (quiet.status_code, quiet.headers["x-fleet-poll"]) == (204, newer)

    elsewhere = await ui.get("/ui/live", params={"size": "10", "since": newer})
    assert elsewhere.headers["x-fleet-mode"] == "full"  # the token was the filter's
    assert len(_uids(elsewhere.text)) == 10
    instance, version, *rest = newer.split(".")
    future = ".".join([instance, str(int(version) + 1000), *rest])
    ahead = await ui.get("/ui/live", params={**query, "since": future})
    assert ahead.headers["x-fleet-mode"] == "full"
    assert sorted(_uids(ahead.text)) == sorted(shown)


async def test_time_travel_pages_too(ui: httpx.AsyncClient) -> None:
    # To the microsecond: an instant cut to the second could fall before the fleet's events.
    at = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    got = await ui.get("/ui", params={"at": at, "size": "10", "page": "2", "sort": "name"})
    assert got.status_code == 200, got.text
    assert len(_uids(got.text)) == 10
    assert 'Page <b data-count="page">2</b> of 3' in got.text
    assert "data-since" not in got.text  # a past instant does not poll


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("page", "-1"),
        ("page", "0"),
        ("page", "abc"),
        ("page", "9" * 300),
        ("size", "5"),
        ("size", "100000"),
        ("size", "\uff11\uff10"),
        ("sort", HOSTILE),
        ("sort", "name; drop"),
        ("order", HOSTILE),
    ],
)
async def test_hostile_paging_is_a_400_naming_the_field(
    ui: httpx.AsyncClient, name: str, value: str
) -> None:
    for path in ("/ui", "/ui/live"):
        got = await ui.get(path, params={name: value})
        assert got.status_code == 400, (path, got.text)
        assert f"{name}:" in got.text
        assert HOSTILE not in got.text


@pytest.mark.parametrize(
    "value",
    [
        HOSTILE,
        "x" * 10_000,
        "é\u202e\u0000",
        "1.2.3.4",
        "a.99999999999999999999.b.c",
        "a.99999999999999999999.b.c.d",
        "a.-1.b.c.d",
        "....",
    ],
)
async def test_a_hostile_since_or_search_is_harmless(ui: httpx.AsyncClient, value: str) -> None:
    live = await ui.get("/ui/live", params={"since": value})
    assert live.status_code == 200
    assert live.headers["x-fleet-mode"] == "full"
    assert HOSTILE not in live.text
    searched = await ui.get("/ui", params={"q": value})
    assert searched.status_code == 200
    assert HOSTILE not in searched.text
