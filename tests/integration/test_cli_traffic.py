"""``traffic`` against a real nats-server: the gateway's records summed per client, proxy, lease
and host, one client's or one proxy's, over a range that ``--at`` moves into the past.

Commands run in-process through click's runner (tests/support/clirun.py).
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest

from events.subjects import TRAFFIC_STREAM
from events.traffic import TrafficRow
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.ordered import OrderedPull
from services.runtime.nats.connection import connect
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.clirun import cli, restore_logging_after
from tests.support.traffic import append, record

pytestmark = pytest.mark.integration

restore_logging = pytest.fixture(autouse=True)(restore_logging_after)


def lines(output: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


async def test_traffic_sums_the_records_per_table_and_moves_into_the_past(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    shop = TrafficRow(host="shop.example", requests=3, bytes_up=30, bytes_down=3000, status_2xx=3)
    cdn = TrafficRow(host="cdn.example", requests=1, tunnels=1, bytes_up=5, bytes_down=50_000)
    await append(jetstream_store, record("crawler-a", "de-3", "l1", shop, cdn), "m1")
    await append(jetstream_store, record("crawler.b", "us-1", "l2", shop), "m2")
    await asyncio.sleep(0.05)
    between = datetime.now(UTC)
    await asyncio.sleep(0.05)
    late = TrafficRow(host="shop.example", requests=1, bytes_down=7, status_4xx=1, blocked=1)
    await append(jetstream_store, record("crawler-a", "de-3", "l3", late), "m3")
    url = ("--nats-url", nats_server.url, "-o", "json")

    by_client = await cli("traffic", *url)
    assert by_client.exit_code == 0, by_client.output
    got = {row["client"]: (row["requests"], row["bytes_down"]) for row in lines(by_client.stdout)}
    assert got == {"crawler-a": (5, 53_007), "crawler.b": (3, 3000)}

    by_proxy = await cli("traffic", "--by", "proxy", "--client", "crawler-a", *url)
    rows = lines(by_proxy.stdout)
    assert [(r["proxy"], r["proxy_uid"], r["tunnels"], r["blocked"]) for r in rows] == [
        ("crawl/de-3", "de-3", 1, 1)
    ]

    by_host = await cli("traffic", "--by", "host", "--proxy", "crawl/us-1", *url)
    assert [(r["host"], r["bytes_up"]) for r in lines(by_host.stdout)] == [("shop.example", 30)]

    before = await cli("traffic", "--by", "lease", "--at", between.isoformat(), *url)
    assert {r["lease"] for r in lines(before.stdout)} == {"l1", "l2"}  # not yet l3
    empty = await cli("traffic", "--at", between.isoformat(), "--since", "1ms", *url)
    assert lines(empty.stdout) == []
    assert "no traffic recorded" in empty.stderr

    table = await cli("traffic", "--by", "proxy", "--nats-url", nats_server.url)
    assert table.exit_code == 0, table.output
    assert "crawl/de-3" in table.stdout
    assert "TOTAL" in table.stdout


async def test_traffic_refuses_a_range_it_cannot_read(nats_server: EmbeddedNatsServer) -> None:
    result = await cli("traffic", "--since", "soon", "--nats-url", nats_server.url)
    assert result.exit_code == 2
    assert "is not a duration" in result.stderr
    endless = await cli("traffic", "--since", "100000h", "--nats-url", nats_server.url)
    assert endless.exit_code == 2
    assert "366 days" in endless.stderr


async def test_a_range_is_read_from_its_start_not_from_the_streams(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    """``--since`` starts the server's delivery at that time: what came before is not sent."""
    row = TrafficRow(host="shop.example", requests=1, bytes_down=10, status_2xx=1)
    for n in range(3):
        await append(jetstream_store, record("crawler-a", "de-3", f"old{n}", row), f"o{n}")
    await asyncio.sleep(0.05)
    since = datetime.now(UTC)
    await append(jetstream_store, record("crawler-a", "de-3", "new", row), "n1")
    conn = await connect(nats_server.url)
    try:
        pull = OrderedPull(conn.js, TRAFFIC_STREAM, "traffic.*", start_time=since)
        first = await pull.fetch(5.0)
        await pull.close()
    finally:
        await conn.close()
    assert [m.metadata.sequence.stream for m in first] == [4]
