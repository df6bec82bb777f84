"""The console's pages on a real discovery replica: fleet, proxy timeline, time travel, login."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from markupsafe import escape

from events import subjects
from events.schemas import HealthChanged, LeaseAcquired, LeaseReported
from events.store import NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy, set_health

pytestmark = pytest.mark.integration

TOKEN = "console-test-token"
HOSTILE = '<script>alert("x")</script>'
ESCAPED = str(escape(HOSTILE))
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def _served(url: str, token: str | None) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        discovery(url, token=token) as (_service, base),
        # A browser states where a form post comes from; the console refuses one from elsewhere.
        httpx.AsyncClient(base_url=base, timeout=20, headers={"Origin": base}) as client,
    ):
        yield client


@pytest.fixture
async def ui(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> AsyncIterator[httpx.AsyncClient]:
    await ready_proxy(jetstream_store, "p1", {"country": "de"})
    await ready_proxy(jetstream_store, "p2", {"country": "fr", "note": HOSTILE}, healthy=None)
    async for client in _served(nats_server.url, None):
        yield client


async def _until(client: httpx.AsyncClient, path: str, text: str) -> str:
    """The page once it shows ``text``: the views follow the log within moments."""
    async with asyncio.timeout(10):
        while True:
            body = (await client.get(path)).text
            if text in body:
                return body
            await asyncio.sleep(0.05)


async def test_fleet_page_lists_filters_counts_and_escapes(ui: httpx.AsyncClient) -> None:
    response = await ui.get("/ui")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    body = response.text
    assert 'data-uid="p1"' in body
    assert 'data-uid="p2"' in body
    assert HOSTILE not in body
    assert ESCAPED in body  # shown, as text
    assert '<b data-count="healthy">1</b>' in body
    assert '<b data-count="unknown">1</b>' in body
    assert '<b data-count="available">1</b>' in body

    unhealthy = (await ui.get("/ui", params={"health": "unknown"})).text
    assert 'data-uid="p2"' in unhealthy
    assert 'data-uid="p1"' not in unhealthy
    german = (await ui.get("/ui", params={"attrs": "country=de", "phase": "Ready"})).text
    assert 'data-uid="p1"' in german
    assert 'data-uid="p2"' not in german
    assert 'data-uid="p1"' in (await ui.get("/ui/live", params={"attr.country": "de"})).text

    bad = await ui.get("/ui", params={"colour": "red"})
    assert bad.status_code == 400
    assert "unknown query parameter &#39;colour&#39;" in bad.text
    assert (await ui.get("/ui", params={"phase": "Sleeping"})).status_code == 400
    assert (await ui.get("/ui", params={"at": "yesterday"})).status_code == 400
    assert (await ui.get("/ui/static/console.js")).status_code == 200
    assert (await ui.get("/ui/static/..%2Fapp.py")).status_code == 404


async def test_live_part_follows_the_log(
    ui: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    await set_health(jetstream_store, "p1", healthy=False)
    body = await _until(ui, "/ui/live?health=unhealthy", 'data-uid="p1"')
    assert "<html" not in body  # only the part the page swaps in
    assert '<b data-count="unhealthy">1</b>' in body


async def test_proxy_page_shows_timeline_with_trace_ids_and_time_travel(
    ui: httpx.AsyncClient, jetstream_store: JetStreamEventStore, conn: Connection
) -> None:
    before = datetime.now(UTC)
    await asyncio.sleep(0.05)
    verdict = HealthChanged(healthy=False, reason="Probe", message=f"refused {HOSTILE}")
    await jetstream_store.append(subjects.proxy("p1"), [NewEvent(verdict, "v-p1-down")])
    # A lease and a report straight into the log, one with a trace header as a traced writer
    # would send it.
    js = jetstream_store
    acquired = LeaseAcquired(lease_id="l1", proxy_uid="p1", holder=HOSTILE, ttl_seconds=600)
    await js.append(subjects.lease("p1"), [NewEvent(acquired, "l1-acq")])
    report = LeaseReported(lease_id="l1", proxy_uid="p1", outcome="blocked", detail=HOSTILE)
    await js.append(subjects.lease("p1"), [NewEvent(report, "l1-rep")])
    await conn.js.publish(
        "proxy.p1.health",
        b'{"type":"HealthChanged","healthy":true,"reason":"Probe","latency_ms":3.5}',
        headers={"Egress-Event-Type": "HealthChanged", "traceparent": TRACEPARENT},
    )

    page = await _until(ui, "/ui/proxies/p1", "3.5 ms")
    assert "ProxyDeclared" in page
    assert "PhaseChanged" in page
    assert "LeaseReported" in page
    assert "4bf92f3577b34da6a3ce929d0e0e4736" in page
    assert HOSTILE not in page
    assert ESCAPED in page
    assert 'data-col="lease"' in page
    assert "leased" in page

    earlier = await ui.get("/ui/proxies/p1", params={"at": before.isoformat()})
    assert earlier.status_code == 200
    old = earlier.text
    assert "As of" in old
    assert "folded" in old
    assert "LeaseAcquired" not in old
    assert "refused" not in old
    assert '<span class="badge healthy">healthy</span>' in old

    fleet_then = (await ui.get("/ui", params={"at": before.strftime("%Y-%m-%dT%H:%M:%S.%f")})).text
    assert 'data-live="' not in fleet_then  # a past state does not update
    assert '<b data-count="leased">0</b>' in fleet_then
    fleet_now = await _until(ui, "/ui", '<b data-count="leased">1</b>')
    assert ESCAPED in fleet_now

    gone = (await ui.get("/ui", params={"at": "2001-01-01T00:00:00Z"})).text
    assert "No proxies at that time." in gone
    assert (await ui.get("/ui/proxies/p1", params={"at": "2001-01-01T00:00"})).status_code == 404
    assert (await ui.get("/ui/proxies/nobody")).status_code == 404
    assert (await ui.get("/ui/proxies/a.b")).status_code == 404
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert (await ui.get("/ui", params={"at": later})).status_code == 400


async def test_login_sets_a_strict_http_only_cookie(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    async for ui in _served(nats_server.url, TOKEN):
        page = await ui.get("/ui/proxies/p1?at=2001-01-01T00:00:00")
        assert page.status_code == 303
        assert page.headers["location"].startswith("/ui/login?next=")
        assert (await ui.get("/ui/live")).status_code == 401
        form = await ui.get("/ui/login")
        assert 'type="password"' in form.text
        assert 'method="post"' in form.text

        wrong = await ui.post("/ui/login", data={"token": "nope", "next": "/ui"})
        assert wrong.status_code == 401
        assert "not valid" in wrong.text
        assert "set-cookie" not in wrong.headers

        ok = await ui.post("/ui/login", data={"token": TOKEN, "next": "https://evil.example/"})
        assert ok.status_code == 303
        assert ok.headers["location"] == "/ui"
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie.replace("strict", "Strict")
        assert TOKEN not in cookie
        assert TOKEN not in ok.headers["location"]
        assert 'data-uid="p1"' in (await ui.get("/ui")).text  # the client keeps the cookie
        assert (await ui.get("/v1/proxies")).status_code == 401  # the cookie is not the token

        out = await ui.post("/ui/logout")
        assert out.status_code == 303
        assert (await ui.get("/ui")).status_code == 303
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert (await ui.get("/ui", headers=bearer)).status_code == 200
