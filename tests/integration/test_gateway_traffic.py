"""The gateway's traffic records on a real nats-server: requests and a tunnel through the gateway
come back from the TRAFFIC stream, folded, as the exact bytes the crawler's socket moved; and a
flush whose acknowledgement is lost is appended again and stored once
(docs/decisions/0158-traffic-records.md)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from events import subjects
from events.errors import StoreUnavailable, StreamConfigMismatch
from events.store import AppendResult, History, NewEvent
from events.subjects import Aggregate
from projections import traffic
from services.gateway.pure.traffic import Exchange
from services.gateway.traffic import TrafficRecorder, traffic_metrics
from services.providers.pure.targets import AllowedTarget
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import DAY, GIB, STREAMS, ensure_streams
from services.runtime.nats.connection import connect
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.crawl_site import crawl_site
from tests.support.crawl_squid import tagged_squids
from tests.support.discovery import discovery, ready_proxy
from tests.support.gateway import TOKENS, UIDS, Fleet, gateway, gateway_clients
from tests.support.waiting import until

pytestmark = pytest.mark.integration

LOGIN = (
    "Proxy-Authorization: Basic "
    + base64.b64encode(f"crawler-a:{TOKENS['crawler-a']}".encode()).decode()
)


@contextlib.asynccontextmanager
async def fleet(
    nats_server: EmbeddedNatsServer,
    store: JetStreamEventStore,
    tmp_path: Path,
    interval: float = 1.0,
) -> AsyncIterator[Fleet]:
    """``test_gateway``'s fleet, whose Squids may also open tunnels to the site's port."""
    clients_file = gateway_clients(tmp_path / "clients.yaml")
    with crawl_site(64, block=False) as site:
        targets = (AllowedTarget(cidr="127.0.0.1/32", ports=(site.port,)),)
        async with (
            tagged_squids(tmp_path / "squids", UIDS, targets=targets) as squids,
            discovery(nats_server.url, clients_file=clients_file) as (_, api),
        ):
            for squid in squids:
                await ready_proxy(store, squid.uid, {"country": "de"}, port=squid.port)
            async with gateway(nats_server.url, api, clients_file, traffic_interval=interval) as gw:
                yield Fleet(site, api, gw.bound_port, nats_server.url, clients_file)


async def exchange(port: int, head: bytes, body: bytes = b"") -> tuple[bytes, bytes]:
    """Send ``head`` to the gateway and, once it answers 200 to a CONNECT, ``body`` into the
    tunnel; everything received until the connection closes, split after the gateway's head
    for a tunnel."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        if not body:
            return await reader.read(-1), b""
        established = await reader.readuntil(b"\r\n\r\n")
        assert established.startswith(b"HTTP/1.1 200"), established
        writer.write(body)
        await writer.drain()
        return established, await reader.read(-1)
    finally:
        writer.close()


def without_marks(received: bytes) -> int:
    """What the proxy sent: the answer less the two header lines the gateway adds."""
    marks = [
        line
        for line in received.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
        if line.lower().startswith((b"x-egress-proxy:", b"x-egress-lease:"))
    ]
    assert len(marks) == 2, received[:300]
    return len(received) - sum(len(line) + 2 for line in marks)


async def test_the_traffic_of_requests_and_a_tunnel_folds_back_to_the_exact_bytes(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path) as f:
        site = f"127.0.0.1:{f.site.port}"
        down = 0
        for page in (1, 2, 3):
            head = (
                f"GET http://{site}/page/{page} HTTP/1.1\r\nHost: {site}\r\n{LOGIN}\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            received, _ = await exchange(f.gateway_port, head)
            assert received.startswith(b"HTTP/1.1 200"), received[:200]
            down += without_marks(received)
        inner = f"GET /page/4 HTTP/1.1\r\nHost: {site}\r\nConnection: close\r\n\r\n".encode()
        connect = f"CONNECT {site} HTTP/1.1\r\nHost: {site}\r\n{LOGIN}\r\n\r\n".encode()
        _, tunnelled = await exchange(f.gateway_port, connect, inner)
        # The site answers what it reads in the tunnel (it wants a proxy's header, which a
        # tunnel cannot add): bytes each way all the same, and the tunnel itself succeeded.
        assert tunnelled.startswith(b"HTTP/1.0 400"), tunnelled[:200]
        down += len(tunnelled)

        async def folded() -> traffic.TrafficView:
            history = await jetstream_store.read(subjects.traffic("crawler-a"))
            return traffic.fold(history.events)

        async def all_recorded() -> bool:
            return (await folded()).total.requests >= 4

        await until(all_recorded, timeout=15, what="the traffic records of four exchanges")
        view = await folded()
    assert view.unusable == 0
    sums = view.clients["crawler-a"]
    assert (sums.requests, sums.tunnels, sums.status_2xx) == (4, 1, 4)
    assert (sums.bytes_up, sums.bytes_down) == (len(inner), down)
    assert view.hosts["127.0.0.1"].bytes_down == down
    assert sum(t.requests for t in view.leases.values()) == 4
    assert set(view.proxy_names.values()) <= {f"crawl/px-{uid}" for uid in ("g1", "g2", "g3")}


async def test_a_graceful_stop_records_the_interval_it_cut_short(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    async with fleet(nats_server, jetstream_store, tmp_path, interval=3600.0) as f:
        site = f"127.0.0.1:{f.site.port}"
        head = (
            f"GET http://{site}/page/1 HTTP/1.1\r\nHost: {site}\r\n{LOGIN}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        received, _ = await exchange(f.gateway_port, head)
        assert received.startswith(b"HTTP/1.1 200"), received[:200]
        history = await jetstream_store.read(subjects.traffic("crawler-a"))
        assert history.events == []  # an hour to go before the next flush
    history = await jetstream_store.read(subjects.traffic("crawler-a"))
    view = traffic.fold(history.events)
    assert (view.total.requests, view.total.bytes_down) == (1, without_marks(received))


class LosingAcks:
    """The real store, whose first appends succeed on the server while the caller hears that
    they failed: what a timeout after the server stored the message looks like."""

    def __init__(self, store: JetStreamEventStore, lose: int) -> None:
        self.store = store
        self.lose = lose

    async def append(
        self, aggregate: Aggregate, events: Sequence[NewEvent], expected_seq: int | None = None
    ) -> AppendResult:
        result = await self.store.append(aggregate, events, expected_seq)
        if self.lose:
            self.lose -= 1
            raise StoreUnavailable("the acknowledgement was lost")
        return result

    async def read(self, aggregate: Aggregate, after_seq: int = 0) -> History:
        return await self.store.read(aggregate, after_seq)


async def test_a_flush_retried_after_a_lost_acknowledgement_is_stored_once(
    jetstream_store: JetStreamEventStore,
) -> None:
    recorder = TrafficRecorder(
        LosingAcks(jetstream_store, lose=1),
        traffic_metrics(CollectorRegistry()),
        interval=10.0,
        replica="gw-test",
    )
    for lease in ("lease-1", "lease-2"):
        recorder.count(
            Exchange(
                "crawler-a",
                "uid-1",
                "crawl/de-1",
                lease,
                "shop.example",
                "success",
                200,
                up=100,
                down=1000,
            )
        )
    assert await recorder.flush() == 0
    assert len(recorder.backlog) == 2
    recorder.count(
        Exchange(
            "crawler-a",
            "uid-1",
            "crawl/de-1",
            "lease-1",
            "shop.example",
            "success",
            200,
            up=1,
            down=10,
        )
    )
    assert await recorder.flush() == 3
    history = await jetstream_store.read(subjects.traffic("crawler-a"))
    assert len(history.events) == 3  # the first record once, the second and the new one
    view = traffic.fold(history.events)
    assert (view.total.requests, view.total.bytes_up, view.total.bytes_down) == (3, 201, 2010)


async def test_the_traffic_stream_is_made_with_its_limits_and_a_different_one_is_reported(
    nats_server: EmbeddedNatsServer,
) -> None:
    conn = await connect(nats_server.url)
    try:
        await ensure_streams(conn.js)
        made = (await conn.js.stream_info(subjects.TRAFFIC_STREAM)).config
        assert (made.subjects, made.max_bytes, made.max_age) == (
            ["traffic.*"],
            2 * GIB,
            7 * DAY,
        )
        await conn.js.delete_stream(subjects.TRAFFIC_STREAM)
        unbounded = replace(
            next(s for s in STREAMS if s.name == subjects.TRAFFIC_STREAM), max_bytes=-1
        )
        await conn.js.add_stream(unbounded.config(replicas=1))
        with pytest.raises(StreamConfigMismatch) as refused:
            await ensure_streams(conn.js)
        assert "max_bytes" in str(refused.value)
    finally:
        await conn.close()
