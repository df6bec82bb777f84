"""The console's pools pages and the fleet's pool filter on a real discovery replica over a real
nats-server: a pool declared as ``apply`` declares it, its controller's decision and its members'
Proxies appended as they would be, then the pages read, travelled back in time, and fed markup."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from markupsafe import escape

from commands.pooldeclaring import apply_pool, scale_pool
from events import subjects
from events.customresource import cli_uid
from events.pool import PoolDecided, PoolDeclared, PoolFigures, PoolMember, PoolSpec, SpreadEntry
from events.poolresource import member_name, pool_uid
from events.schemas import LeaseAcquired, Phase, ProxySpec
from events.store import EventStore, NewEvent
from services.discovery.console.render import pool_path
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

DE = pool_uid("crawl", "de")
US = pool_uid("crawl", "us")
HOSTILE = '<img src=x onerror="alert(1)">'
"""No ``/`` in it: a pool so named in a hand-written log still has a page of its own."""
SCRIPT = '<script>alert("x")</script>'
STRANGER = "stranger"
"""A proxy with the members' very attributes that no pool planned: never a member."""
TOKEN = "console-pools-token"


def _member(pool: str, uid: str, ordinal: int, provider: str) -> PoolMember:
    name = member_name(pool, uid, ordinal)
    return PoolMember(ordinal=ordinal, name=name, uid=cli_uid("crawl", name), provider=provider)


MEMBERS = (
    _member("de", DE, 0, "local"),
    _member("de", DE, 1, "local"),
    _member("de", DE, 2, "gcp"),
)
SPEC = PoolSpec(
    replicas=3,
    template=ProxySpec(provider="local", attributes={"country": "de"}),
    spread=(SpreadEntry(provider="local", weight=2), SpreadEntry(provider="gcp", weight=1)),
)


async def _decide(store: EventStore, uid: str, members: tuple[PoolMember, ...], msg: str) -> None:
    """The controller's first decision about a pool, as it records it."""
    decided = PoolDecided(
        uid=uid,
        reason="ScaleUp",
        message=msg,
        added=members,
        figures=PoolFigures(desired=len(members)),
        generation=1,
    )
    await store.append(subjects.pool(uid), [NewEvent(decided, f"{uid}-decided-1")])


async def _member_proxy(
    store: EventStore,
    planned: PoolMember,
    phase: Phase = Phase.READY,
    healthy: bool | None = True,
) -> None:
    """The member's Proxy as the controller declares it and the reconciler and the health
    service then leave it."""
    await ready_proxy(
        store,
        planned.uid,
        {"country": "de", "pool": "de"},
        name=planned.name,
        provider=planned.provider,
        phase=phase,
        healthy=healthy,
    )


@pytest.fixture
async def store(jetstream_store: JetStreamEventStore) -> JetStreamEventStore:
    """crawl/de: 3 members wanted, 2 Ready and healthy (one leased), the third provisioning;
    crawl/us: declared, nothing decided yet; and a stranger carrying the pool's attribute."""
    assert (await apply_pool(jetstream_store, "crawl", "de", SPEC)).result == "created"
    await _decide(jetstream_store, DE, MEMBERS, "added 3 (0 -> 3 of 3)")
    await _member_proxy(jetstream_store, MEMBERS[0])
    await _member_proxy(jetstream_store, MEMBERS[2])
    await _member_proxy(jetstream_store, MEMBERS[1], phase=Phase.PROVISIONING, healthy=None)
    acquired = LeaseAcquired(
        lease_id="l0", proxy_uid=MEMBERS[0].uid, holder="crawler-1", ttl_seconds=600
    )
    await jetstream_store.append(subjects.lease(MEMBERS[0].uid), [NewEvent(acquired, "l0")])
    await apply_pool(jetstream_store, "crawl", "us", SPEC)
    await ready_proxy(jetstream_store, STRANGER, {"country": "de", "pool": "de"})
    return jetstream_store


@pytest.fixture
async def ui(
    nats_server: EmbeddedNatsServer, store: JetStreamEventStore
) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        discovery(nats_server.url) as (_service, base),
        httpx.AsyncClient(base_url=base, timeout=20) as client,
    ):
        yield client


def _cell(body: str, row: str, column: str) -> str:
    """The text of one ``data-col`` cell of the row whose opening tag holds ``row``."""
    found = re.search(rf'{re.escape(row)}.*?data-col="{column}">([^<]*)<', body, re.S)
    assert found is not None, f"no {column} cell in the row {row}"
    return found.group(1)


async def test_the_pools_page_lists_each_pools_figures_and_conditions(
    ui: httpx.AsyncClient,
) -> None:
    response = await ui.get("/ui/pools")
    assert response.status_code == 200, response.text
    assert "script-src 'self'" in response.headers["content-security-policy"]
    body = response.text
    assert '<a href="/ui/pools">Pools</a>' in body  # in the navigation of every page
    de = 'data-pool="crawl/de"'
    got = {c: _cell(body, de, c) for c in ("desired", "members", "ready", "healthy", "leased")}
    assert got == {"desired": "3", "members": "3", "ready": "2", "healthy": "2", "leased": "1"}
    assert _cell(body, de, "available") == "1"
    assert "Scaling=True (MembersNotReady)" in body
    assert "ScaleUp: added 3 (0 -&gt; 3 of 3)" in body
    assert _cell(body, 'data-pool="crawl/us"', "members") == "0"
    assert "none yet" in body
    assert 'href="/ui/pools/crawl/de"' in body
    assert '<a href="/ui/pools">Pools</a>' in (await ui.get("/ui")).text
    part = (await ui.get("/ui/pools/live")).text
    assert "<html" not in part
    assert de in part
    refused = await ui.get("/ui/pools", params={"namespace": "crawl"})
    assert refused.status_code == 400
    assert "unknown query parameter &#39;namespace&#39;" in refused.text


async def test_a_pools_page_shows_members_by_state_spread_and_timeline(
    ui: httpx.AsyncClient, store: JetStreamEventStore
) -> None:
    assert (await scale_pool(store, "crawl", "de", 4)).result == "scaled"
    body = await _page_once(ui, "/ui/pools/crawl/de", "(scaled; the spec says 3)")
    ready, provisioning = MEMBERS[0], MEMBERS[1]
    assert f'href="/ui/proxies/{ready.uid}"' in body
    assert f'data-member="{ready.uid}" data-state="Ready"' in body
    assert f'data-member="{provisioning.uid}" data-state="Provisioning"' in body
    assert body.index(f'data-member="{MEMBERS[2].uid}"') < body.index(
        f'data-member="{provisioning.uid}"'
    )  # Ready ones first
    assert "crawler-1" in body
    assert '<span data-state="Ready">2 Ready</span>' in body
    assert _cell(body, 'data-provider="local"', "members") == "2"
    assert _cell(body, 'data-provider="gcp"', "ready") == "1"
    assert "(scaled; the spec says 3)" in body
    timeline = body[body.index("Scaling timeline") :]
    kinds = re.findall(r'<tr data-type="(\w+)">', timeline)
    assert kinds == ["PoolScaled", "PoolDecided", "PoolDeclared"]  # newest first
    assert "to 4 replicas" in timeline
    assert "added 3" in timeline
    assert "3 / 0 / 0 / 0 / 0 / 0" in timeline  # the figures the decision saw
    assert "<html" not in (await ui.get("/ui/pools/crawl/de/live")).text

    missing = await ui.get("/ui/pools/crawl/fr")
    assert missing.status_code == 404
    assert "no pool crawl/fr in the log" in missing.text
    assert "Not found" in missing.text
    assert (await ui.get("/ui/pools/crawl/de", params={"x": "1"})).status_code == 400


async def _page_once(ui: httpx.AsyncClient, path: str, text: str) -> str:
    """The page once it shows ``text``: the replica's views follow the log within moments."""
    got: list[str] = []

    async def shows() -> bool:
        got[:] = [(await ui.get(path)).text]
        return text in got[0]

    await until(shows, 10, what=f"{path} showing {text!r}")
    return got[0]


async def test_time_travel_shows_a_pool_as_it_was(
    ui: httpx.AsyncClient, store: JetStreamEventStore
) -> None:
    # Instants between appends, on this machine's clock, which stamps the server's too: the
    # log's own stamps are read back rounded one way by the store and the other by a time
    # travel, so one of them is no exact bound.
    decided = datetime.now(UTC)
    await scale_pool(store, "crawl", "de", 5)
    await _page_once(ui, "/ui/pools/crawl/de", 'data-count="desired">5<')
    scaled = datetime.now(UTC)

    then = (await ui.get("/ui/pools/crawl/de", params={"at": decided.isoformat()})).text
    assert "As of" in then
    assert "data-live" not in then  # a past state does not update
    assert 'data-count="desired">3<' in then
    assert "to 5 replicas" not in then
    assert '<tr data-type="PoolDecided">' in then
    assert f'href="/ui/proxies/{MEMBERS[0].uid}?at=' in then  # the member as it was then
    listed_then = (await ui.get("/ui/pools", params={"at": scaled.isoformat()})).text
    assert _cell(listed_then, 'data-pool="crawl/de"', "desired") == "5"
    assert "As of" in listed_then

    before = "2001-01-01T00:00:00Z"
    assert "No pools at that time." in (await ui.get("/ui/pools", params={"at": before})).text
    gone = await ui.get("/ui/pools/crawl/de", params={"at": before})
    assert gone.status_code == 404
    assert "at that time" in gone.text
    assert (await ui.get("/ui/pools", params={"at": "soon"})).status_code == 400


async def test_the_fleet_page_filters_a_pools_members(ui: httpx.AsyncClient) -> None:
    every = (await ui.get("/ui")).text
    assert f'data-uid="{STRANGER}"' in every
    assert '<option value="crawl/de">crawl/de</option>' in every
    assert 'href="/ui/pools/crawl/de"' in every  # the member rows name their pool

    members = await ui.get("/ui", params={"pool": "crawl/de"})
    assert members.status_code == 200, members.text
    body = members.text
    assert all(f'data-uid="{m.uid}"' in body for m in MEMBERS)
    assert f'data-uid="{STRANGER}"' not in body  # its attributes, but planned by no pool
    assert '<option value="crawl/de" selected>crawl/de</option>' in body
    assert 'data-live="/ui/live?pool=crawl%2Fde"' in body
    ready = (await ui.get("/ui/live", params={"pool": "crawl/de", "phase": "Ready"})).text
    assert f'data-uid="{MEMBERS[0].uid}"' in ready
    assert f'data-uid="{MEMBERS[1].uid}"' not in ready
    assert (await ui.get("/ui", params={"pool": "crawl/us"})).status_code == 200  # no member

    unknown = await ui.get("/ui", params={"pool": "crawl/fr"})
    assert unknown.status_code == 400
    assert "pool: no pool &#39;crawl/fr&#39;; the pools are crawl/de, crawl/us" in unknown.text
    bad = await ui.get("/ui", params={"pool": "Crawl/DE!"})
    assert bad.status_code == 400
    assert "pool: " in bad.text
    assert "NAMESPACE/NAME" in bad.text
    then = await ui.get("/ui", params={"pool": "crawl/de", "at": "2001-01-01T00:00:00Z"})
    assert then.status_code == 400
    assert "at that time" in then.text


async def test_markup_from_the_log_renders_inert(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    """A pool hand-written into the log with markup for its names, source, reason and message,
    and a member whose attributes and holder are markup: shown as text on every page."""
    uid = "hostile-pool"
    spec = PoolSpec(replicas=1, template=ProxySpec(provider="local", attributes={"k": SCRIPT}))
    declared = PoolDeclared(uid=uid, namespace=HOSTILE, name=HOSTILE, spec=spec, source=SCRIPT)
    member = PoolMember(ordinal=0, name="hostile-0", uid="hostile-0", provider="local")
    decided = PoolDecided(uid=uid, reason=SCRIPT, message=HOSTILE, added=(member,))
    await jetstream_store.append(
        subjects.pool(uid), [NewEvent(declared, "h-declared"), NewEvent(decided, "h-decided")]
    )
    await ready_proxy(jetstream_store, member.uid, {SCRIPT: HOSTILE}, name=member.name)
    acquired = LeaseAcquired(lease_id="lh", proxy_uid=member.uid, holder=SCRIPT, ttl_seconds=600)
    await jetstream_store.append(subjects.lease(member.uid), [NewEvent(acquired, "lh")])
    async with (
        discovery(nats_server.url) as (_service, base),
        httpx.AsyncClient(base_url=base, timeout=20) as ui,
    ):
        path = pool_path(HOSTILE, HOSTILE)
        pages = {
            "/ui/pools": await ui.get("/ui/pools"),
            path: await ui.get(path),
            path + "/live": await ui.get(path + "/live"),
            "/ui": await ui.get("/ui"),
        }
        now = {"at": datetime.now(UTC).isoformat()}
        pages["travel"] = await ui.get(path, params=now)
        for where, response in pages.items():
            assert response.status_code == 200, (where, response.text)
            body = response.text
            for text in (HOSTILE, SCRIPT):
                assert text not in body, where
            assert "<img" not in body, where
            assert "<script>" not in body, where
        assert str(escape(HOSTILE)) in pages[path].text
        assert str(escape(SCRIPT)) in pages[path].text  # its reason, its holder
        assert f'href="{path}"' in pages["/ui/pools"].text
        assert f'href="{path}"' in pages["/ui"].text  # the member's pool column
        missing = await ui.get(pool_path(SCRIPT, "x"))
        assert missing.status_code == 404
        assert SCRIPT not in missing.text


async def test_the_pools_pages_need_a_session_where_the_console_does(
    nats_server: EmbeddedNatsServer, store: JetStreamEventStore
) -> None:
    async with (
        discovery(nats_server.url, token=TOKEN) as (_service, base),
        httpx.AsyncClient(base_url=base, timeout=20) as ui,
    ):
        listing = await ui.get("/ui/pools")
        assert listing.status_code == 303
        assert listing.headers["location"].startswith("/ui/login?next=%2Fui%2Fpools")
        assert (await ui.get("/ui/pools/crawl/de")).status_code == 303
        assert (await ui.get("/ui/pools/live")).status_code == 401
        assert (await ui.get("/ui/pools/crawl/de/live")).status_code == 401
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert (await ui.get("/ui/pools/crawl/de", headers=bearer)).status_code == 200
