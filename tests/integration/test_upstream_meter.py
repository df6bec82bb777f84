"""The meter with real Squids of the upstream provider, the fake proxy service and a real
nats-server, logged in as the executor (docs/decisions/0161-metering-upstream-bytes.md):
requests and a tunnel under a lease are metered to that lease with the bytes our Squid saw, a
refused request is not, a meter killed between its append and its offset loses nothing and
counts nothing twice, and a rotation with Squid reopening its log keeps every line."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from events import subjects
from events.meter import UpstreamMetered
from events.schemas import InstanceState, ProxySpec
from services.executor.meter import ROTATED, STATE_FILE, Meter, load_state, meter_metrics
from services.providers.base import CreateRequest
from services.providers.local_process import ACCESS_LOG
from services.providers.pure.targets import AllowedTarget
from services.providers.squidauth.keyed import lease_keyed
from services.providers.squidauth.pure import scheme
from services.providers.squidauth.pure.scheme import lease_id_of
from services.providers.upstream.provider import SESSION_LABEL, UpstreamProvider
from services.providers.upstream.pure.templates import NAMED
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer
from services.testing.upstream import UpstreamService
from tests.contract.provider import delete_all
from tests.integration.test_proxy_auth import MASTER, Proxy, lease
from tests.support.clirun import restore_logging_after
from tests.support.egress_site import EgressSite
from tests.support.upstream_support import (
    ACCOUNT,
    PASSWORD,
    StartService,
    site,
    start_service,
)
from tests.support.waiting import until

__all__ = ["site", "start_service"]  # fixtures

pytestmark = pytest.mark.integration

restore_logging = pytest.fixture(autouse=True)(restore_logging_after)

ROOT = Path(__file__).resolve().parents[2]
WAIT = 30.0
ENTRY = "resi-de"
BUDGET = 5_000_000_000
FAR = 4_102_444_800_000
"""2100-01-01 in milliseconds: a probe credential that does not expire during the test."""


@dataclass
class Leased:
    provider: UpstreamProvider
    service: UpstreamService
    site: EgressSite
    port: int
    proxy_uid: str
    session: str
    lease_id: str
    authorization: bytes

    def fetch(self, head: str, body: bytes = b"", *, inner: bytes = b"") -> tuple[int, int]:
        """One exchange through the proxy on a connection of its own, as a crawler would make
        it: the bytes it sent and received. ``inner`` is written once a tunnel is open."""
        lines = head.encode() + b"\r\n" + self.authorization + b"\r\n\r\n" + body
        return exchange(self.port, lines, inner)


def exchange(port: int, data: bytes, inner: bytes = b"") -> tuple[int, int]:
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(data)
        if inner:
            while b"\r\n\r\n" not in received:
                more = sock.recv(65536)
                assert more, received
                received += more
            assert received.split(b" ")[1] == b"200", received
            sock.sendall(inner)
        while chunk := sock.recv(65536):
            received += chunk
    assert received.startswith(b"HTTP/1.1 "), received
    return len(data) + len(inner), len(received)


@pytest.fixture
async def executor_conn(
    nats_server: EmbeddedNatsServer, conn: Connection
) -> AsyncIterator[Connection]:
    """The executor's own NATS user: what it may publish is what the meter needs (``conn``
    made the streams)."""
    del conn
    connection = await connect(nats_server.url_for("executor"))
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
async def leased(
    tmp_path: Path, start_service: StartService, site: EgressSite
) -> AsyncIterator[Leased]:
    service = start_service("oxylabs")
    targets = (AllowedTarget(cidr="127.0.0.1/32", ports=(site.http_port,)),)
    provider = UpstreamProvider(
        ENTRY,
        tmp_path / "resi",
        endpoint=("127.0.0.1", service.proxy_port),
        templates=NAMED["oxylabs"],
        password=PASSWORD,
        allowed_countries=("de", "fr"),
        account=ACCOUNT,
        session_seconds=1800,
        stop_grace=0.5,
        max_bytes_per_day=BUDGET,
        targets=targets,
    )
    uid = str(uuid.uuid4())
    request = CreateRequest(
        name="de-1",
        owner_uid=uid,
        namespace="crawl",
        proxy_name="de-1",
        spec=ProxySpec(provider=ENTRY, attributes={"country": "de"}),
    )
    try:
        provider_id = await lease_keyed(provider, MASTER).create(request)

        async def is_running() -> bool:
            return (await provider.get(provider_id)).state is InstanceState.RUNNING

        await until(is_running, WAIT, what="Running")
        instance = await provider.get(provider_id)
        url = lease(Proxy(uid, instance.url, provider.data_dir / "instances" / "de-1"), 1, 600)
        credentials = url.split("//", 1)[1].rsplit("@", 1)[0]
        yield Leased(
            provider=provider,
            service=service,
            site=site,
            port=instance.port,
            proxy_uid=uid,
            session=instance.labels[SESSION_LABEL],
            lease_id=lease_id_of(credentials.partition(":")[0]),
            authorization=b"Proxy-Authorization: Basic " + base64.b64encode(credentials.encode()),
        )
    finally:
        await delete_all(provider)


async def metered(store: JetStreamEventStore) -> list[UpstreamMetered]:
    found = []
    for event in (await store.read(subjects.meter(ENTRY))).decoded():
        assert isinstance(event, UpstreamMetered)
        found.append(event)
    return found


def totals(records: list[UpstreamMetered]) -> dict[str, tuple[int, int, int]]:
    sums: dict[str, tuple[int, int, int]] = {}
    for r in records:
        n, up, down = sums.get(r.lease_id, (0, 0, 0))
        sums[r.lease_id] = (n + r.requests, up + r.bytes_up, down + r.bytes_down)
    return sums


async def meter_until(meter: Meter, store: JetStreamEventStore, requests: int) -> None:
    """Squid logs an exchange as it ends, a moment after the crawler saw it end."""

    async def all_in() -> bool:
        await meter.meter_once()
        return sum(r.requests for r in await metered(store)) >= requests

    await until(all_in, WAIT, what=f"{requests} requests metered")


def make_meter(
    store: JetStreamEventStore, provider: UpstreamProvider, *, rotate_bytes: int = 1 << 20
) -> Meter:
    metrics = meter_metrics(CollectorRegistry())
    return Meter(store, [provider], metrics, replica="test", rotate_bytes=rotate_bytes)


async def test_requests_and_a_tunnel_are_metered_to_their_lease_with_the_bytes_squid_saw(
    leased: Leased, executor_conn: Connection
) -> None:
    store = JetStreamEventStore(executor_conn.nc, executor_conn.js)
    meter = make_meter(store, leased.provider)
    page = f"GET {leased.site.url('/page')} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close"
    body = b"x" * 20_000
    post = (
        f"POST {leased.site.url('/form')} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}"
    )
    plain = [
        await asyncio.to_thread(leased.fetch, page),
        await asyncio.to_thread(leased.fetch, post, body),
    ]
    refused = await asyncio.to_thread(
        exchange, leased.port, page.encode() + b"\r\n\r\n"
    )  # no credential: our Squid answers 407, nothing reaches the service
    assert refused[1] > 0
    probe = scheme.probe_credential(scheme.proxy_key(MASTER, leased.proxy_uid), FAR)
    prober = base64.b64encode(f"{probe.user}:{probe.password}".encode())
    probed = await asyncio.to_thread(
        exchange,
        leased.port,
        page.encode() + b"\r\nProxy-Authorization: Basic " + prober + b"\r\n\r\n",
    )  # the health prober's: no lease, metered apart
    await meter_until(meter, store, 3)
    before = leased.service.session(leased.session, "de")
    target = f"127.0.0.1:{leased.site.http_port}"
    inner = f"GET /tunnelled HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n".encode()
    connect_head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}"
    tunnel = await asyncio.to_thread(leased.fetch, connect_head, inner=inner)
    await meter_until(meter, store, 4)

    records = await metered(store)
    assert totals(records) == {
        leased.lease_id: (
            3,
            sum(sent for sent, _ in [*plain, tunnel]),
            sum(received for _, received in [*plain, tunnel]),
        ),
        "": (1, *probed),
    }
    for record in records:
        assert record.proxy_uid == leased.proxy_uid
        assert record.budget_bytes_per_day == BUDGET
        assert record.provider == ENTRY
    # The tunnel's record alone: its bytes up are the CONNECT head and what the crawler wrote
    # into the tunnel, which is what the service counted for the session.
    [last] = [r for r in records if r.lease_id and r.bytes_up == tunnel[0]]
    assert last.requests == 1
    after = leased.service.session(leased.session, "de")
    assert after["bytesUp"] - before["bytesUp"] == len(inner)
    assert after["bytesDown"] - before["bytesDown"] < last.bytes_down
    assert after["requests"] == 4
    skipped = meter.metrics.lines.labels(ENTRY, "denied")._value.get()
    assert skipped == 1


async def test_a_meter_killed_between_append_and_offset_loses_and_doubles_nothing(
    leased: Leased, executor_conn: Connection, nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    store = JetStreamEventStore(executor_conn.nc, executor_conn.js)
    page = f"GET {leased.site.url('/one')} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close"
    first = [await asyncio.to_thread(leased.fetch, page) for _ in range(3)]
    log = leased.provider.metered()[0].log_dir / ACCESS_LOG
    await until(lambda: log.read_bytes().count(b"\n") >= 3, WAIT, what="3 lines logged")

    marker = tmp_path / "appended"
    with (tmp_path / "worker.log").open("w") as worker_log:
        worker = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "tests.support.meter_worker", nats_server.url_for("executor")),
            *(str(leased.provider.data_dir), ENTRY, str(BUDGET), str(marker)),
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            stderr=worker_log,
        )
        try:
            await until(marker.exists, WAIT, what="the worker's append")
        finally:
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signal.SIGKILL)
            await worker.wait()
    state = load_state(leased.provider.metered()[0].instance_dir / STATE_FILE)
    assert state.pending > 0
    assert state.offset == 0  # killed after the append, before the offset
    assert totals(await metered(store))[leased.lease_id][0] == 3

    more = await asyncio.to_thread(leased.fetch, page)  # while no meter ran
    meter = make_meter(store, leased.provider)
    await meter_until(meter, store, 4)
    await meter.meter_once()
    sent = sum(s for s, _ in [*first, more])
    received = sum(r for _, r in [*first, more])
    assert totals(await metered(store)) == {leased.lease_id: (4, sent, received)}


async def test_a_rotated_log_is_reopened_by_squid_and_every_line_metered_once(
    leased: Leased, executor_conn: Connection
) -> None:
    store = JetStreamEventStore(executor_conn.nc, executor_conn.js)
    meter = make_meter(store, leased.provider, rotate_bytes=1)
    instance = leased.provider.metered()[0]
    page = f"GET {leased.site.url('/r')} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close"
    done = []
    for count in range(1, 4):
        done.append(await asyncio.to_thread(leased.fetch, page))
        await meter_until(meter, store, count)  # each step after a line rotates
    await until((instance.log_dir / ACCESS_LOG).exists, WAIT, what="Squid reopened its log")
    await meter.meter_once()
    await meter.meter_once()
    assert not (instance.log_dir / ROTATED).exists()
    assert load_state(instance.instance_dir / STATE_FILE).generation >= 3
    sent, received = sum(s for s, _ in done), sum(r for _, r in done)
    assert totals(await metered(store)) == {leased.lease_id: (3, sent, received)}
