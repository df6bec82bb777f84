"""No secret reaches the event log (D84): a proxy created through the reconciler and the
executor, on a real nats-server and a real Squid that enforces leases, leaves neither the master
secret nor its proxy key in any event, in any stream."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from commands.declaring import apply
from events import subjects
from events.schemas import Phase
from services.cli.fleet.manifests import parse_resources
from services.providers.local import LocalProvider
from services.providers.squidauth.keyed import lease_keyed
from services.providers.squidauth.pure.scheme import proxy_key
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.contract.provider import delete_all
from tests.integration.test_proxy_auth import status_via
from tests.support.lifecycle import fleet, view
from tests.support.system import hello_target
from tests.support.waiting import until

pytestmark = pytest.mark.integration

MASTER = b"events-test-master-secret-0123456789"
DOC = """
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: guarded, namespace: crawl}
spec:
  provider: local
  cloudInit: {inline: "#cloud-config\\npackages: [squid]\\n"}
"""


async def raw_payloads(conn: Connection, stream: str) -> list[bytes]:
    """Every message of ``stream`` as stored, read by sequence."""
    info = await conn.js.stream_info(stream)
    payloads: list[bytes] = []
    if not info.state.messages:
        return payloads
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        message = await conn.js.get_msg(stream, seq)
        payloads.append(bytes(message.data or b"") + repr(message.headers).encode())
    return payloads


async def test_a_created_proxy_enforces_leases_and_no_event_holds_a_secret(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    conn: Connection,
    tmp_path: Path,
) -> None:
    local = LocalProvider("local", tmp_path / "local", backend="squid", stop_grace=0.5)
    try:
        async with fleet(nats_server.url, {"local": lease_keyed(local, MASTER)}):
            [resource] = parse_resources(DOC, "test")
            uid = (await apply(jetstream_store, resource)).uid

            async def ready() -> bool:
                got = await view(jetstream_store, uid)
                return got is not None and got.phase is Phase.READY

            await until(ready, timeout=60, what="Ready")
            got = await view(jetstream_store, uid)
            assert got is not None
            with hello_target() as target:
                assert await asyncio.to_thread(status_via, got.url, target) == 407
        secrets = [MASTER, proxy_key(MASTER, uid).hex().encode(), proxy_key(MASTER, uid)]
        for stream in (
            subjects.PROXY_STREAM,
            subjects.LEASE_STREAM,
            subjects.GC_STREAM,
            subjects.DEADLETTER_STREAM,
        ):
            payloads = await raw_payloads(conn, stream)
            if stream == subjects.PROXY_STREAM:
                assert len(payloads) >= 4, "declared, cmd, instance, status: the events to check"
            for payload in payloads:
                for secret in secrets:
                    assert secret not in payload
    finally:
        await delete_all(local)
