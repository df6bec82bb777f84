"""The executor's answers appended with the server's check, so that the reconciler folds them onto
the state it kept and takes a proxy from declared to Ready without reading it, on a real
nats-server (docs/decisions/0168-executor-facts-chained.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest
from nats.aio.msg import Msg

from commands.declaring import apply
from events import codec, subjects
from events.schemas import (
    HealthChanged,
    InstanceCreated,
    InstanceObserved,
    Phase,
    PhaseChanged,
)
from events.store import AppendResult, History, NewEvent, Recorded
from events.subjects import Aggregate
from services.cli.fleet.manifests import parse_resources
from services.executor.commands import CommandHandler
from services.executor.service import ExecutorService
from services.reconciler.service import ReconcilerService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.consumer import Delivery
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.metrics import Metrics
from services.runtime.service import Service, ServiceContext
from services.runtime.settings.shared import Settings
from services.testing.provider import FakeProvider
from tests.support.executor_harness import FAST, create, declare, history, send
from tests.support.lifecycle import FAST as FLEET_POLICY
from tests.support.lifecycle import view
from tests.support.waiting import until

pytestmark = pytest.mark.integration


async def expected_of(conn: Connection, seq: int) -> int | None:
    """What the stored message at ``seq`` was appended expecting, as the reconciler reads it."""
    msg = await conn.js.get_msg(subjects.PROXY_STREAM, seq)
    uid = subjects.proxy_uid_of(msg.subject or "")
    return codec.expected_last(msg.headers, subjects.proxy(uid).filter_subject)


def of(events: list[Recorded], kind: type) -> Recorded:
    [found] = [r for r in events if isinstance(r.event, kind)]
    return found


async def handle_once(store: JetStreamEventStore, uid: str) -> None:
    """The executor's handler given the proxy's command, as one delivery."""
    handler = CommandHandler(store, {"fake": FakeProvider()}, policy=FAST, metrics=Metrics())
    [command] = [r for r in await history(store, uid) if r.subject.endswith(".cmd")]
    await handler(Delivery(command, 1, cast(Msg, None)))


async def test_answers_follow_the_command_under_the_server_s_check(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await declare(jetstream_store, "c1")
    await send(jetstream_store, "c1", create())
    await handle_once(jetstream_store, "c1")
    events = await history(jetstream_store, "c1")
    command, created = events[1], of(events, InstanceCreated)
    running = of(events, InstanceObserved)
    assert await expected_of(conn, created.seq) == command.seq
    assert await expected_of(conn, running.seq) == created.seq


async def test_an_event_in_between_never_stops_an_answer(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """Something appended after the command (here a health event): the answer conflicts with
    the command's sequence, is stored anyway, once, without the check, and the next answer
    follows it under the check again."""
    await declare(jetstream_store, "c2")
    await send(jetstream_store, "c2", create())
    between = NewEvent(HealthChanged(healthy=True, reason="Probe"), "c2-between")
    await jetstream_store.append(subjects.proxy("c2"), [between])
    await handle_once(jetstream_store, "c2")
    events = await history(jetstream_store, "c2")
    created, running = of(events, InstanceCreated), of(events, InstanceObserved)
    assert await expected_of(conn, created.seq) is None
    assert await expected_of(conn, running.seq) == created.seq
    await handle_once(jetstream_store, "c2")  # a redelivery stores nothing more
    assert len(await history(jetstream_store, "c2")) == len(events) == 5


@dataclass
class Counting:
    """The real store, counting the reads the reconciler makes."""

    store: JetStreamEventStore
    reads: list[str] = field(default_factory=list)

    async def read(self, aggregate: Aggregate, after_seq: int = 0) -> History:
        self.reads.append(str(aggregate))
        return await self.store.read(aggregate, after_seq)

    async def append(
        self, aggregate: Aggregate, events: list[NewEvent], expected_seq: int | None = None
    ) -> AppendResult:
        return await self.store.append(aggregate, events, expected_seq)


@asynccontextmanager
async def running(url: str, service: Service, counting: bool = False) -> AsyncIterator[Counting]:
    conn = await connect(url)
    store = Counting(JetStreamEventStore(conn.nc, conn.js))
    ctx = ServiceContext(
        settings=Settings(nats_url=url),
        conn=conn,
        store=store if counting else store.store,  # type: ignore[arg-type]
        metrics=Metrics(),
    )
    task = asyncio.create_task(service.run(ctx))
    try:
        yield store
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await conn.close()


DOC = """
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: quiet, namespace: crawl}
spec: {provider: fake, placement: {zone: a}}
"""


async def test_a_proxy_goes_from_declared_to_ready_without_a_read(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """Every event of the proxy's life follows its predecessor under the server's check, so the
    reconciler decides both times from the state it kept: no read at all."""
    fake = FakeProvider(pending_polls=1)
    executor = ExecutorService(
        None, Path("."), 3600.0, providers={"fake": fake}, policy=FLEET_POLICY, ack_wait=5.0
    )
    async with (
        running(nats_server.url, ReconcilerService(), counting=True) as reconciler,
        running(nats_server.url, executor),
    ):
        [resource] = parse_resources(DOC, "test")
        uid = (await apply(jetstream_store, resource)).uid

        async def ready() -> bool:
            v = await view(jetstream_store, uid)
            return v is not None and v.phase is Phase.READY

        await until(ready, timeout=30)
    events = (await jetstream_store.read(subjects.proxy(uid))).events
    assert isinstance(events[-1].event, PhaseChanged)
    seqs = [r.seq for r in events]
    expected = [await expected_of(conn, seq) for seq in seqs]
    assert expected == [0, *seqs[:-1]]
    assert reconciler.reads == []
