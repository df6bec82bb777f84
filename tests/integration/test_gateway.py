"""The gateway relays crawlers' requests through leased proxies: real Squids, a real discovery
replica on a real nats-server, real HTTP clients (httpx here; curl and others in e2e)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import pytest

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.gateway import TOKENS, UIDS, basic, fleet, gateway, proxy_url
from tests.support.waiting import until

pytestmark = pytest.mark.integration


async def test_a_crawler_fetches_through_the_gateway_with_its_name_and_token(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path) as f, f.client() as http:
        answer = await http.get(f.page(1))
        assert answer.status_code == 200, answer.text
        assert "page 1" in answer.text
        proxy = answer.headers["x-egress-proxy"]
        assert proxy.startswith("crawl/px-g")
        assert answer.headers["x-egress-lease"]
        assert f.site.visits[-1].proxy in UIDS


async def test_a_session_keeps_its_proxy_and_requests_without_one_rotate(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path, rotating_leases=3) as f:
        async with f.client("crawler-a-country-de-session-s1") as sticky:
            for n in range(8):
                assert (await sticky.get(f.page(n))).status_code == 200
        seen = {v.proxy for v in f.site.visits}
        assert len(seen) == 1, f.site.visits
        f.site.visits.clear()
        async with f.client("crawler-a-country-de") as rotating:
            for n in range(9):
                assert (await rotating.get(f.page(n))).status_code == 200
        assert len({v.proxy for v in f.site.visits}) >= 2, f.site.visits


async def test_two_replicas_give_one_session_one_proxy(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path) as f:
        async with gateway(f.nats_url, f.api, f.clients_file) as second:
            user = "crawler-a-session-shared"
            one = f.client(user)
            two = httpx.AsyncClient(
                proxy=proxy_url(second.bound_port, user), timeout=20, trust_env=False
            )
            async with one, two:
                answers = await asyncio.gather(
                    *(c.get(f.page(n)) for n in range(6) for c in (one, two))
                )
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
        assert len({a.headers["x-egress-lease"] for a in answers}) == 1
        assert len({v.proxy for v in f.site.visits}) == 1


async def test_the_same_session_id_of_two_clients_is_two_sessions(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with (
        fleet(nats_server, jetstream_store, tmp_path) as f,
        f.client("crawler-a-session-x") as a,
        f.client("crawler-b-session-x", client="crawler-b") as b,
    ):
        first, second = await a.get(f.page(1)), await b.get(f.page(2))
        assert first.status_code == second.status_code == 200
        assert first.headers["x-egress-lease"] != second.headers["x-egress-lease"]
        assert first.headers["x-egress-proxy"] != second.headers["x-egress-proxy"]


async def test_a_blocked_answer_is_reported_and_the_request_leaves_through_another_proxy(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with (
        fleet(nats_server, jetstream_store, tmp_path, block=True) as f,
        f.client() as http,
    ):
        answers = [await http.get(f.page(n)) for n in range(6)]
        assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
        statuses = Counter((v.proxy == f.site.blocked, v.status) for v in f.site.visits)
        assert statuses[(True, 403)] == 1  # the block was the blocked proxy's last request there
        assert statuses[(False, 200)] == 6
        async with httpx.AsyncClient(
            base_url=f.api, headers={"Authorization": f"Bearer {TOKENS['crawler-a']}"}
        ) as api:

            async def reported() -> bool:
                listed = await api.get("/v1/leases", params={"holder": "gateway/rotating"})
                outcomes = [o for lease in listed.json()["items"] for o in lease["outcomes"]]
                return any(o["outcome"] == "blocked" for o in outcomes)

            await until(reported, timeout=10, what="a blocked report in the log")


@pytest.mark.parametrize(
    ("login", "status", "reason"),
    [
        (None, 407, "needs a proxy login"),
        (("crawler-a", "wrong"), 407, "token (the proxy password) is not valid"),
        (("crawler-b", TOKENS["crawler-a"]), 407, "must start with the client's name"),
        (("crawler-a-country", TOKENS["crawler-a"]), 407, "'country' has no value"),
        (("reader", TOKENS["reader"]), 403, "lacks the lease scope"),
    ],
)
async def test_a_login_the_gateway_cannot_use_is_refused_with_its_reason(  # noqa: PLR0917 - pytest passes fixtures and parameters by position
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    tmp_path: Path,
    login: tuple[str, str] | None,
    status: int,
    reason: str,
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path) as f:
        reader, writer = await asyncio.open_connection("127.0.0.1", f.gateway_port)
        auth = f"Proxy-Authorization: {basic(*login)}\r\n" if login else ""
        writer.write(f"GET {f.page(1)} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n".encode())
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        writer.close()
        assert head.startswith(f"HTTP/1.1 {status} "), head
        assert reason in head
        if status == 407:
            assert 'Proxy-Authenticate: Basic realm="egress-proxies"' in head
        assert not f.site.visits
