"""The console's traffic pages on a real discovery replica over a real nats-server: the
gateway's records appended as it appends them, then a client's page and a proxy's panel read
back with the exact figures, a range with none, hostile names, the record bound and who may
see whose traffic (docs/console.md, "Traffic")."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from markupsafe import escape

from events import subjects
from events.traffic import TrafficRow
from services.discovery.console import traffic_read
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.pure.clients import hash_token
from tests.support.discovery import discovery, ready_proxy
from tests.support.traffic import append, record

pytestmark = pytest.mark.integration

HOSTILE = "'\"><iframe>&"
"""A name a record may carry (printable, no spaces): an open gateway's label is what the user
name began with. No ``/``: a path cannot carry one to the page."""
SHOP = TrafficRow(host="shop.example", requests=3, bytes_up=30, bytes_down=3000, status_2xx=3)
CDN = TrafficRow(host="cdn.example", requests=1, tunnels=1, bytes_up=5, bytes_down=50_000)
LATE = TrafficRow(host="shop.example", requests=1, bytes_down=7, status_4xx=1, blocked=1)


@pytest.fixture
async def before(jetstream_store: JetStreamEventStore) -> datetime:
    """crawler-a through de-3 (two records, two leases) and us-1, crawler.b and a hostile label
    through de-3; returns an instant before all of them."""
    await ready_proxy(jetstream_store, "de-3", {"country": "de"}, name="de-3")
    await asyncio.sleep(0.05)
    instant = datetime.now(UTC)
    await asyncio.sleep(0.05)
    await append(jetstream_store, record("crawler-a", "de-3", "l1", SHOP, CDN), "m1")
    await append(jetstream_store, record("crawler-a", "us-1", "l2", SHOP), "m2")
    await append(jetstream_store, record("crawler.b", "de-3", "l4", SHOP), "m3")
    await append(jetstream_store, record("crawler-a", "de-3", "l3", LATE), "m4")
    await append(jetstream_store, record(HOSTILE, "de-3", "l5", LATE), "m5")
    return instant


@pytest.fixture
async def ui(nats_server: EmbeddedNatsServer, before: datetime) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        discovery(nats_server.url) as (_service, base),
        httpx.AsyncClient(base_url=base, timeout=20) as client,
    ):
        yield client


def cells(body: str, table: str) -> dict[str, dict[str, str]]:
    """A traffic table's rows: key -> its ``data-col`` cells."""
    found = re.search(rf'<table class="traffic" id="{table}">(.*?)</table>', body, re.S)
    assert found is not None, table
    rows = {}
    for key, row in re.findall(r'<tr data-key="([^"]*)">(.*?)</tr>', found.group(1), re.S):
        rows[key] = dict(re.findall(r'data-col="([^"]+)"[^>]*>([^<]*)<', row))
    return rows


def bar_total(body: str, chart: str) -> int:
    """The sum of one chart's bars, as their titles say."""
    figure = re.search(rf'data-chart="{chart}">(.*?)</figure>', body, re.S)
    assert figure is not None, chart
    return sum(int(n) for n in re.findall(r": (\d+) requests</title>", figure.group(1)))


async def test_a_clients_page_shows_its_traffic_by_proxy_and_host_and_charts_it(
    ui: httpx.AsyncClient,
) -> None:
    page = await ui.get("/ui/clients/crawler-a")
    assert page.status_code == 200, page.text
    body = page.text
    proxies = cells(body, "by-proxy")
    assert set(proxies) == {"de-3", "us-1"}
    assert proxies["de-3"] == {
        "requests": "5",
        "tunnels": "1",
        "up": "35",
        "down": "53007",
        "blocked": "1",
        "failed": "0",
    }
    assert proxies["us-1"]["requests"] == "3"
    assert 'href="/ui/proxies/de-3"' in body
    hosts = cells(body, "by-host")
    assert (hosts["shop.example"]["requests"], hosts["shop.example"]["down"]) == ("7", "6007")
    assert hosts["cdn.example"]["down"] == "50000"
    assert bar_total(body, "requests") == 8  # crawler.b's and the hostile label's left out
    assert "8 requests" in body
    day = await ui.get("/ui/clients/crawler-a", params={"range": "day"})
    assert bar_total(day.text, "requests") == 8
    assert "last day, per 15 minutes" in day.text


async def test_a_proxys_page_has_its_traffic_by_client_and_lease(ui: httpx.AsyncClient) -> None:
    page = await ui.get("/ui/proxies/de-3")
    assert page.status_code == 200, page.text
    clients = cells(page.text, "by-client")
    assert {key: row["requests"] for key, row in clients.items()} == {
        "crawler-a": "5",
        "crawler.b": "3",
        str(escape(HOSTILE)): "1",
    }
    leases = cells(page.text, "by-lease")
    assert {key: row["down"] for key, row in leases.items()} == {
        "l1": "53000",
        "l3": "7",
        "l4": "3000",
        "l5": "7",
    }
    assert "l2" not in leases  # us-1's
    assert 'href="/ui/clients/crawler.b"' in page.text
    assert "<iframe>" not in page.text
    assert f'href="/ui/clients/{quote(HOSTILE, safe="")}"' in page.text


async def test_hostile_names_are_escaped_and_bounded_and_an_empty_range_says_so(
    ui: httpx.AsyncClient, before: datetime
) -> None:
    hostile = await ui.get("/ui/clients/" + quote(HOSTILE, safe=""))
    assert hostile.status_code == 200, hostile.text
    assert "<iframe>" not in hostile.text
    assert str(escape(HOSTILE)) in hostile.text
    assert cells(hostile.text, "by-proxy")["de-3"]["blocked"] == "1"
    long = await ui.get("/ui/clients/" + "x" * 5000)
    assert long.status_code == 404
    assert "x" * 41 not in long.text
    spaced = await ui.get("/ui/clients/a%20b%3Cimg%3E")
    assert spaced.status_code == 404
    assert "<img>" not in spaced.text
    assert (await ui.get("/ui/clients/crawler-a", params={"range": "week"})).status_code == 400
    past = await ui.get("/ui/clients/crawler-a", params={"at": before.isoformat()})
    assert past.status_code == 200
    assert 'id="no-traffic"' in past.text
    assert 'id="by-proxy"' not in past.text
    panel = await ui.get("/ui/proxies/de-3", params={"at": before.isoformat()})
    assert 'id="no-traffic"' in panel.text


async def test_a_range_over_the_record_bound_is_refused_and_the_proxy_page_still_answers(
    ui: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(traffic_read, "MAX_RECORDS", 2)
    page = await ui.get("/ui/clients/crawler-a")  # 3 records
    assert page.status_code == 422
    assert "more than 2 events" in page.text
    proxy = await ui.get("/ui/proxies/de-3")
    assert proxy.status_code == 200
    assert 'id="traffic-refused"' in proxy.text
    assert 'id="card"' in proxy.text


async def test_a_client_sees_only_its_own_traffic_and_an_admin_all(
    nats_server: EmbeddedNatsServer, before: datetime, tmp_path: Path
) -> None:
    del before
    clients = tmp_path / "clients.yaml"
    clients.write_text(
        "clients:\n"
        f"  - {{name: crawler-a, token: '{hash_token('token-a')}', scopes: [lease, read]}}\n"
        f"  - {{name: boss, token: '{hash_token('token-boss')}', scopes: [admin]}}\n"
    )
    async with (
        discovery(nats_server.url, clients_file=clients) as (_service, base),
        httpx.AsyncClient(base_url=base, timeout=20) as anyone,
    ):
        assert (await anyone.get("/ui/clients/crawler-a")).status_code == 303
        own = {"Authorization": "Bearer token-a"}
        mine = await anyone.get("/ui/clients/crawler-a", headers=own)
        assert cells(mine.text, "by-proxy")["de-3"]["requests"] == "5"
        other = await anyone.get("/ui/clients/crawler.b", headers=own)
        assert other.status_code == 403
        panel = await anyone.get("/ui/proxies/de-3", headers=own)
        assert set(cells(panel.text, "by-client")) == {"crawler-a"}
        assert "yours only" in panel.text
        boss = {"Authorization": "Bearer token-boss"}
        assert (await anyone.get("/ui/clients/crawler.b", headers=boss)).status_code == 200
        every = await anyone.get("/ui/proxies/de-3", headers=boss)
        assert len(cells(every.text, "by-client")) == 3


async def test_a_read_starts_at_the_ranges_first_record(conn: Connection, before: datetime) -> None:
    """The binary search over the stream's sequences: a range is read from its first record on,
    whatever the stream holds before it."""
    js = conn.js
    assert await traffic_read.first_at(js, before) == 1
    last = (await js.stream_info(subjects.TRAFFIC_STREAM)).state.last_seq
    assert await traffic_read.first_at(js, datetime.now(UTC)) == last + 1
    third = (await js.get_msg(subjects.TRAFFIC_STREAM, 3)).time
    assert third is not None
    assert await traffic_read.first_at(js, third) == 3


async def test_without_the_stream_a_client_page_says_so_and_a_proxy_page_still_answers(
    ui: httpx.AsyncClient, conn: Connection
) -> None:
    await conn.js.delete_stream(subjects.TRAFFIC_STREAM)
    page = await ui.get("/ui/clients/crawler-a")
    assert page.status_code == 503
    assert "stream TRAFFIC does not exist" in page.text
    proxy = await ui.get("/ui/proxies/de-3")
    assert proxy.status_code == 200
    assert "stream TRAFFIC does not exist" in proxy.text
