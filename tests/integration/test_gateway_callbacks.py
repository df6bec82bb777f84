"""The common request answered from callbacks alone (``services.gateway.fast``), on real
sockets: real Squids, a real discovery replica, real clients. Each test counts what the
callbacks answered (``Gateway.by_callbacks``) and what they handed to the coroutine
(``handed_back``), so that it fails if the callbacks' path is gone as well as if it is wrong
(docs/decisions/0166-the-gateway-s-callbacks-path.md)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from pathlib import Path

import httpx
import pytest

from services.gateway.server import Gateway
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.gateway import TOKENS, Fleet, fleet

pytestmark = pytest.mark.integration

LOGIN = base64.b64encode(f"crawler-a:{TOKENS['crawler-a']}".encode())


def running(f: Fleet) -> Gateway:
    assert f.service is not None
    assert f.service.gateway is not None
    return f.service.gateway


async def warm(f: Fleet, http: httpx.AsyncClient | None = None) -> None:
    """Requests until every lease of the ring is held and the login is known: from then on,
    a plain GET is the callbacks'. The leases are not read again meanwhile (a re-read is the
    coroutine's), so that which path answers does not depend on the test's pace."""
    running(f).keeper.refresh = 3600.0
    async with contextlib.AsyncExitStack() as stack:
        if http is None:
            http = await stack.enter_async_context(f.client())
        for n in range(8):
            assert (await http.get(f.page(n))).status_code == 200


async def test_keep_alive_gets_are_answered_by_the_callbacks_whole_and_counted(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path, block=False, rotating_leases=3) as f:
        await warm(f)
        gateway = running(f)
        before = gateway.by_callbacks
        async with f.client() as http:
            answers = [await http.get(f.page(n)) for n in range(20)]
            heads = [await http.head(f.page(n)) for n in range(4)]
        assert [a.status_code for a in answers] == [200] * 20
        assert [a.status_code for a in heads] == [501] * 4  # the site's: HEAD is not its
        assert all(f"page {n}</h1>" in a.text for n, a in enumerate(answers))
        assert all(a.headers["x-egress-proxy"].startswith("crawl/px-g") for a in answers)
        assert all(a.headers["x-egress-lease"] for a in answers + heads)
        assert len({a.headers["x-egress-proxy"] for a in answers}) >= 2  # rotated
        # The first request of a new connection may reach it before its task first runs;
        # every other one is the callbacks'.
        assert gateway.by_callbacks - before >= 23
        assert gateway.handed_back == 0


async def test_a_session_s_gets_are_the_callbacks_and_keep_their_proxy(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path, block=False) as f:
        gateway = running(f)
        gateway.keeper.refresh = 3600.0  # no re-read meanwhile, however slow the machine
        async with f.client("crawler-a-session-s1") as sticky:
            answers = [await sticky.get(f.page(n)) for n in range(10)]
        assert [a.status_code for a in answers] == [200] * 10
        assert len({a.headers["x-egress-lease"] for a in answers}) == 1
        assert len({v.proxy for v in f.site.visits}) == 1
        assert gateway.by_callbacks == 9  # all but the first, which took the lease


async def test_a_block_met_by_the_callbacks_is_judged_before_a_byte_and_retried_elsewhere(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path, block=False, rotating_leases=3) as f:
        gateway = running(f)
        async with f.client() as http:
            await warm(f, http)
            banned = f.site.visits[-1].proxy
            f.site.refused.add(banned)  # the site bans one proxy from now on
            f.site.visits.clear()
            answers = [await http.get(f.page(n)) for n in range(9)]
        assert [a.status_code for a in answers] == [200] * 9, [a.text for a in answers]
        refused = [v for v in f.site.visits if v.status == 403]
        assert [v.proxy for v in refused] == [banned]  # met once, then kept from the host
        assert all(v.proxy != banned for v in f.site.visits if v.status == 200)
        assert gateway.handed_back == 1
        assert gateway.by_callbacks >= 7


async def test_pipelined_heads_are_answered_in_order_by_the_callbacks(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path, block=False, rotating_leases=3) as f:
        await warm(f)
        gateway = running(f)
        before = gateway.by_callbacks
        reader, writer = await asyncio.open_connection("127.0.0.1", f.gateway_port)
        heads = b"".join(
            b"GET %s HTTP/1.1\r\nHost: site\r\nProxy-Authorization: Basic %s\r\n\r\n"
            % (f.page(n).encode(), LOGIN)
            for n in (3, 4, 5)
        )
        writer.write(heads[:-7])
        await asyncio.sleep(0.05)
        own = b"GET http://127.0.0.1:%d/ HTTP/1.1\r\nHost: site\r\nConn" % f.gateway_port
        writer.write(heads[-7:] + own)
        bodies = []
        for _ in range(3):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200"), head
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            bodies.append(await reader.readexactly(length))
        assert [b"page %d</h1>" % n in body for n, body in zip((3, 4, 5), bodies, strict=True)] == [
            True
        ] * 3
        assert gateway.by_callbacks - before >= 2  # the first may come before the task runs
        # The last head, half sent, is the task's to wait for: whole, it is answered by it.
        writer.write(b"ection: close\r\nProxy-Authorization: Basic " + LOGIN + b"\r\n\r\n")
        last = await asyncio.wait_for(reader.read(), 10)
        assert last.startswith(b"HTTP/1.1 403"), last  # the gateway's own port rule, not a byte on
        writer.close()


async def test_a_crawler_that_closes_mid_way_costs_nothing_after(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path, block=False, rotating_leases=3) as f:
        await warm(f)
        gateway = running(f)
        for _ in range(5):
            _, writer = await asyncio.open_connection("127.0.0.1", f.gateway_port)
            writer.write(
                b"GET %s HTTP/1.1\r\nHost: site\r\nProxy-Authorization: Basic %s\r\n\r\n"
                % (f.page(1).encode(), LOGIN)
            )
            writer.close()  # before the answer: the callbacks' write meets a closed socket
        before = gateway.by_callbacks
        async with f.client() as http:
            answers = [await http.get(f.page(n)) for n in range(6)]
        assert [a.status_code for a in answers] == [200] * 6
        assert gateway.by_callbacks - before >= 5
        in_flight = [h.in_flight for ring in gateway.keeper.rings.values() for h in ring.held]
        assert in_flight == [0] * len(in_flight)
