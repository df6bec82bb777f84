"""Nothing a client sends or the log holds can wedge discovery: the real HTTP service, a real
nats-server.

- A body with a value of the wrong type or out of bounds is a 400 naming the field, and nothing
  is written (an event log keeps a bad event for ever).
- A flag that would write out-of-bounds leases stops the service at start-up, naming the flag.
- A hostile ``LeaseAcquired`` published straight to ``lease.<uid>`` (a TTL that overflows, a
  null, a negative number) neither stops discovery from starting or serving, nor holds the
  proxy: it is leased as if the event were not there.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from events import subjects
from services.discovery.service import DiscoveryService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.metrics import Metrics
from services.runtime.service import ServiceContext
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import Settings
from tests.support.clirun import cli, restore_logging_after
from tests.support.discovery import discovery, grant_seq, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

restore_logging = pytest.fixture(autouse=True)(restore_logging_after)

WEEK = 7 * 24 * 3600

BAD_BODIES: list[tuple[Any, str]] = [
    ({"ttlSeconds": "inf"}, "ttlSeconds"),
    ({"ttlSeconds": "60"}, "ttlSeconds"),  # once coerced to 60
    ({"ttlSeconds": "1e-300"}, "ttlSeconds"),
    ({"ttlSeconds": 1e-300}, "ttlSeconds"),  # once granted, already expired
    ({"ttlSeconds": 0.5}, "ttlSeconds"),
    ({"ttlSeconds": 0}, "ttlSeconds"),
    ({"ttlSeconds": -60}, "ttlSeconds"),
    ({"ttlSeconds": WEEK + 1}, "ttlSeconds"),
    ({"ttlSeconds": 1e300}, "ttlSeconds"),
    ({"ttlSeconds": True}, "ttlSeconds"),
    ({"ttlSeconds": [60]}, "ttlSeconds"),
    ({"selector": "country=de"}, "selector"),
    ({"selector": {"country": 1}}, "selector"),
    ({"selector": {"country": None}}, "selector"),
    ({"holder": 7}, "holder"),
    ({"holder": "x" * 257}, "holder"),
    ({"ttlSecnds": 60}, "ttlSecnds"),
    ([], "object"),
    ("60", "object"),
]


def raw(body: Any) -> bytes:
    return json.dumps(body).encode()


@pytest.fixture
async def api(nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore) -> Any:
    await ready_proxy(jetstream_store, "p1", {"country": "de"})
    async with (
        discovery(nats_server.url, max_lease_ttl=600.0) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        yield client


async def test_bad_bodies_are_400_naming_the_field_and_write_nothing(
    api: httpx.AsyncClient, jetstream_store: JetStreamEventStore
) -> None:
    for body, field in BAD_BODIES:
        answer = await api.post(
            "/v1/leases", content=raw(body), headers={"content-type": "application/json"}
        )
        assert answer.status_code == 400, (body, answer.text)
        assert answer.json()["error"] == "invalid_request", body
        assert field in answer.json()["message"], (body, answer.json())
    for literal in (b'{"ttlSeconds": Infinity}', b'{"ttlSeconds": NaN}', b'{"ttlSeconds": 1e400}'):
        answer = await api.post(
            "/v1/leases", content=literal, headers={"content-type": "application/json"}
        )
        assert answer.status_code == 400, (literal, answer.text)
    empty = await api.post("/v1/leases", content=b"")
    assert empty.status_code == 400
    assert "{}" in empty.json()["message"]
    for body, field in (
        ({"outcome": 1}, "outcome"),
        ({"outcome": "success", "detail": 3}, "detail"),
    ):
        report = await api.post("/v1/leases/any/report", json=body)
        assert report.status_code == 400, body
        assert field in report.json()["message"]
    assert (await jetstream_store.read(subjects.lease("p1"))).last_seq == 0


async def test_the_bounds_themselves_are_accepted(api: httpx.AsyncClient) -> None:
    longest = await api.post("/v1/leases", json={"ttlSeconds": WEEK})
    assert longest.status_code == 201, longest.text
    assert (longest.json()["ttlSeconds"], longest.json()["ttlClamped"]) == (600, True)
    assert (await api.delete(f"/v1/leases/{longest.json()['id']}")).status_code == 204
    shortest = await api.post("/v1/leases", json={"ttlSeconds": 1})
    assert shortest.status_code == 201, shortest.text
    assert shortest.json()["ttlSeconds"] == 1


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--max-lease-ttl", "1000000000000"), "--max-lease-ttl"),
        (("--lease-cooldown", "25h"), "--lease-cooldown"),
    ],
)
async def test_the_service_refuses_bounds_breaking_flags_at_start_up(
    nats_server: EmbeddedNatsServer, args: tuple[str, ...], flag: str
) -> None:
    for command in (("run", "discovery", "--nats-url", nats_server.url), ("up",)):
        result = await cli(*command, *args)
        assert result.exit_code == 2, (command, result.output)
        assert f"Invalid value for '{flag}'" in result.output
        assert "168h" in result.output or "24h" in result.output


async def test_a_service_built_in_code_refuses_them_too(conn: Connection) -> None:
    ctx = ServiceContext(
        settings=Settings(),
        conn=conn,
        store=JetStreamEventStore(conn.nc, conn.js),
        metrics=Metrics(),
    )
    service = DiscoveryService(host="127.0.0.1", port=0, max_lease_ttl=1e12)
    with pytest.raises(ConfigError, match=r"^--max-lease-ttl: "):
        await service.run(ctx)
    assert not service.listening.is_set()


HOSTILE: list[dict[str, Any]] = [
    {"ttl_seconds": 1e12},  # OverflowError in the fold, on every start, before the fix
    {"ttl_seconds": 1.7e308},
    {"ttl_seconds": None},  # inf, as msgspec wrote it
    {"ttl_seconds": -5},
    {"ttl_seconds": 60, "cooldown_seconds": 1e15},
    {"ttl_seconds": 60, "deadline": "2026-01-01T00:00:00"},  # naive
    {"ttl_seconds": "60"},
]


async def publish_hostile(url: str, uid: str) -> int:
    """Publish every hostile claim on ``lease.<uid>`` as a raw client would; the last sequence."""
    client = await connect(url)
    try:
        seq = 0
        for i, fields in enumerate(HOSTILE):
            body = {"type": "LeaseAcquired", "lease_id": f"hostile-{i}", "proxy_uid": uid}
            ack = await client.js.publish(f"lease.{uid}", raw(body | fields))
            seq = ack.seq
        return seq
    finally:
        await client.close()


async def test_hostile_claims_in_the_log_neither_stop_discovery_nor_hold_the_proxy(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1", {"country": "de"})
    await ready_proxy(jetstream_store, "p2", {"country": "de"})
    await publish_hostile(nats_server.url, "p1")
    # A fresh start reads them all before it serves: it used to die right here.
    async with (
        discovery(nats_server.url) as (service, base),
        httpx.AsyncClient(base_url=base, timeout=10) as api,
    ):
        assert (await api.get("/healthz")).status_code == 200
        shown = (await api.get("/v1/proxies/p1")).json()
        assert (shown["leased"], shown["available"]) == (False, True)
        assert service.api is not None
        view = service.api.views.lease_view("p1")
        assert view is not None
        assert view.current is None
        assert view.fencing_token == 0
        assert view.unusable + service.api.views.leases.skipped == len(HOSTILE)

        leased = await api.post(
            "/v1/leases", json={"selector": {"country": "de"}, "ttlSeconds": 60}
        )
        other = await api.post("/v1/leases", json={"selector": {"country": "de"}, "ttlSeconds": 60})
        assert (leased.status_code, other.status_code) == (201, 201), (leased.text, other.text)
        assert {leased.json()["proxy"]["uid"], other.json()["proxy"]["uid"]} == {"p1", "p2"}
        on_p1 = next(x.json() for x in (leased, other) if x.json()["proxy"]["uid"] == "p1")
        # The first grant on p1: its token is its own sequence, after the hostile claims'.
        assert on_p1["fencingToken"] == await grant_seq(jetstream_store, "p1", on_p1["id"])

        # And while it runs: hostile claims on the leased proxy change nothing.
        last = await publish_hostile(nats_server.url, "p1")

        async def applied() -> bool:
            assert service.api is not None
            return service.api.views.leases.last_seq >= last

        await until(applied)
        assert (await api.get("/healthz")).status_code == 200
        again = await api.get(f"/v1/leases/{on_p1['id']}")
        assert again.status_code == 200
        assert again.json()["fencingToken"] == on_p1["fencingToken"]
        assert (await api.delete(f"/v1/leases/{on_p1['id']}")).status_code == 204
        view = service.api.views.lease_view("p1")
        assert view is not None
        assert view.granted == 1
