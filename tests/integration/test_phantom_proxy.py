"""A message on ``proxy.<new uid>.*`` without a ``ProxyDeclared`` makes no proxy anywhere a real
discovery replica shows one; a later declaration makes it appear as any other (D95)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from events import codec
from events.schemas import HealthChanged, Phase, PhaseChanged
from services.cli.fleet.proxyviews import listed
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy

pytestmark = pytest.mark.integration

GHOST = "ghost1"


async def _stray(conn: Connection) -> None:
    """What anyone with publish rights on ``proxy.>`` (here the admin) can send: a Ready status
    and a healthy verdict for a uid nobody declared, well-formed, with the event-type header."""
    events = (
        ("status", PhaseChanged(phase=Phase.READY, reason="Forged", url="http://127.0.0.1:9")),
        ("health", HealthChanged(healthy=True, reason="Probe", latency_ms=1.0)),
    )
    for category, event in events:
        ack = await conn.js.publish(
            f"proxy.{GHOST}.{category}",
            codec.encode(event),
            headers={codec.HDR_EVENT_TYPE: codec.event_type(event)},
        )
        assert ack.seq > 0


async def _listed(api: httpx.AsyncClient, uid: str) -> list[str]:
    """The uids ``/v1/proxies`` lists once it lists ``uid``: the views apply in stream order,
    so whatever was stored before ``uid`` has been folded by then."""
    async with asyncio.timeout(10):
        while True:
            items = (await api.get("/v1/proxies")).json()["items"]
            uids = [item["uid"] for item in items]
            if uid in uids:
                return uids
            await asyncio.sleep(0.05)


def _providers(text: str) -> dict[str, float]:
    """provider -> proxies, summed over phases of the ``egress_proxies`` gauge."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "egress_proxies":
            for sample in family.samples:
                provider = sample.labels["provider"]
                out[provider] = out.get(provider, 0) + sample.value
    return out


async def test_a_stray_message_makes_no_proxy_until_it_is_declared(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    async with (
        discovery(nats_server.url) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=10) as api,
    ):
        await _stray(conn)
        await ready_proxy(jetstream_store, "marker", {"country": "de"})
        assert await _listed(api, "marker") == ["marker"]

        assert (await api.get(f"/v1/proxies/{GHOST}")).status_code == 404
        fleet = (await api.get("/ui")).text
        assert 'data-uid="marker"' in fleet
        assert GHOST not in fleet
        gauges = _providers((await api.get("/metrics")).text)
        assert gauges == {"local": 1}, gauges
        assert [v.uid for v in await listed(conn, None)] == ["marker"]  # the CLI's `get`
        # The stray Ready and healthy status is not a proxy a crawler can be given.
        lease = await api.post("/v1/leases", json={"selector": {}, "holder": "c"})
        assert lease.json()["proxy"]["uid"] == "marker", lease.text

        await ready_proxy(jetstream_store, GHOST, {"country": "fr"})
        assert sorted(await _listed(api, GHOST)) == sorted(["marker", GHOST])
        shown = (await api.get(f"/v1/proxies/{GHOST}")).json()
        assert shown["name"] == f"px-{GHOST}"
        assert shown["phase"] == "Ready"
        assert GHOST in (await api.get("/ui")).text
        assert _providers((await api.get("/metrics")).text) == {"local": 2}
    assert sorted(v.uid for v in await listed(conn, None)) == sorted(["marker", GHOST])
