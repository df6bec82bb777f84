"""Time travel on a real discovery replica is bounded: per client, per replica, and by its client
staying (docs/decisions/0095-the-console-and-the-api-bound.md).

The log holds enough events that one fleet travel takes seconds of folding, so travels are
still under way when the next requests arrive. Clients are told apart by address: each uses a
loopback address of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest

from events import codec
from events.schemas import HealthChanged
from services.discovery.console.history import PER_CLIENT, QUEUE, Admission
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.discovery import discovery, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

EVENTS = 25_000
"""Verdicts in the log: several seconds of folding for one travel (0.1 ms each, D87)."""


async def _fill(conn: Connection) -> None:
    data = codec.encode(HealthChanged(healthy=True, reason="Probe", latency_ms=1.0))
    headers = {codec.HDR_EVENT_TYPE: "HealthChanged"}
    for start in range(0, EVENTS, 1000):
        await asyncio.gather(
            *(
                conn.js.publish(f"proxy.p{n % 4}.health", data, headers=headers)
                for n in range(start, start + 1000)
            )
        )


@contextlib.asynccontextmanager
async def _client(base: str, address: str) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.AsyncHTTPTransport(local_address=address)
    async with httpx.AsyncClient(base_url=base, transport=transport, timeout=120) as client:
        yield client


@pytest.fixture
def admissions(monkeypatch: pytest.MonkeyPatch) -> list[Admission]:
    """Every ``Admission`` the replica makes (its one): what it admitted, read instead of
    guessed with a sleep."""
    made: list[Admission] = []
    init = Admission.__init__

    def recording(self: Admission, **kwargs: int) -> None:
        init(self, **kwargs)
        made.append(self)

    monkeypatch.setattr(Admission, "__init__", recording)
    return made


@pytest.fixture
async def travel(
    nats_server: EmbeddedNatsServer,
    conn: Connection,
    jetstream_store: JetStreamEventStore,
    admissions: list[Admission],
) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """The replica's base URL and the query of a fleet travel to just after the log was filled."""
    for n in range(4):
        await ready_proxy(jetstream_store, f"p{n}")
    await _fill(conn)
    await asyncio.sleep(0.05)
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    async with discovery(nats_server.url) as (_service, base):
        await asyncio.sleep(0.05)  # the instant is behind the replica's clock
        yield base, {"at": at}


def _busy(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text[:300]
    assert int(response.headers["retry-after"]) >= 1
    assert "text/html" in response.headers["content-type"]


async def test_one_client_has_a_bounded_share(
    travel: tuple[str, dict[str, str]], admissions: list[Admission]
) -> None:
    base, at = travel
    [admission] = admissions
    async with _client(base, "127.0.0.1") as one, _client(base, "127.0.0.2") as other:
        running = [asyncio.create_task(one.get("/ui", params=at)) for _ in range(PER_CLIENT)]

        def both_admitted() -> bool:  # folding takes seconds: both are still under way
            return sum(admission.by_client.values()) == PER_CLIENT

        await until(both_admitted, timeout=30, what="both reads admitted")
        refused = await one.get("/ui/live", params=at)
        _busy(refused)
        assert "reads of the event log under way" in refused.text
        # The proxy timeline counts in the same share; another client is not refused.
        _busy(await one.get("/ui/proxies/p1", params=at))
        other_read = asyncio.create_task(other.get("/ui/proxies/p1"))
        for done in await asyncio.gather(*running, other_read):
            assert done.status_code == 200, done.text[:300]
        assert (await one.get("/ui/live", params=at)).status_code == 200


async def test_the_queue_is_bounded_and_left_by_clients_that_go_away(
    travel: tuple[str, dict[str, str]],
    admissions: list[Admission],
    captured_logs: pytest.CaptureFixture[str],
) -> None:
    base, at = travel
    [admission] = admissions
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(_client(base, f"127.0.0.{10 + n}"))
            for n in range(QUEUE + 2)
        ]
        held = [asyncio.create_task(c.get("/ui/live", params=at)) for c in clients[:QUEUE]]
        await until(lambda: admission.travels == QUEUE, timeout=30, what="the queue full")
        for late in clients[QUEUE:]:
            refused = await late.get("/ui/live", params=at)
            _busy(refused)
            assert "time travels are queued" in refused.text
        # Every client of the queue leaves: the replica cancels each travel, the running one
        # and those waiting their turn, and says so once for each.
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        logged: list[str] = []

        def abandoned() -> bool:
            logged.append(captured_logs.readouterr().out)
            return "".join(logged).count("log read abandoned by its client") == QUEUE

        await until(abandoned, timeout=15, what="each abandoned travel cancelled")
        assert "Traceback" not in "".join(logged)

        newcomer = clients[-1]

        async def admitted() -> bool:
            probe = await newcomer.get("/ui/proxies/p1", params=at)
            return probe.status_code != 429

        await until(admitted, timeout=15, what="the abandoned travels' places given back")
        answered = await newcomer.get("/ui/live", params=at)
        assert answered.status_code == 200, answered.text[:300]
        assert 'data-uid="p1"' in answered.text
