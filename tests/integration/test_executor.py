"""The executor's command handling against a real nats-server: answers, retries, redeliveries."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from nats.aio.msg import Msg

from events import subjects
from events.errors import StoreUnavailable
from events.schemas import (
    DeleteInstance,
    ErrorClass,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    ObserveInstance,
    ProviderFailed,
)
from events.store import AppendResult, NewEvent
from services.executor.commands import CommandHandler
from services.executor.pure.answers import observed
from services.providers.base import (
    CreateRequest,
    Permanent,
    QuotaExceeded,
    Transient,
)
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.consumer import Delivery
from services.runtime.observability.metrics import Metrics
from services.testing.provider import FakeProvider
from tests.support.executor_harness import (
    FAST,
    SPEC,
    answered,
    answers,
    count,
    create,
    declare,
    executor,
    history,
    send,
    settled,
)
from tests.support.waiting import until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------ create


async def test_create_records_created_then_running(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider(pending_polls=2)
    await declare(jetstream_store, "u1")
    async with executor(conn, jetstream_store, {"fake": fake}):
        await send(jetstream_store, "u1", create())
        got = await answered(jetstream_store, "u1", InstanceObserved)
        await settled(conn)
    pid = "fake-inst-c1"
    assert got == [
        InstanceCreated(command_id="c1", provider="fake", provider_id=pid),
        observed("c1", "fake", fake.instances[pid]),
    ]
    running = got[1]
    assert isinstance(running, InstanceObserved)
    assert (running.state, running.url) == (InstanceState.RUNNING, "http://10.0.0.1:3128")
    assert fake.calls == [("create", "inst-c1")] + [("get", pid)] * 3
    assert fake.instances[pid].owner_uid == "u1"
    causes = {r.causation_id for r in await history(jetstream_store, "u1") if r.seq > 2}
    assert causes == {"cmd-u1-c1"}


async def test_handled_again_creates_nothing_more(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """The same delivery handled three times (redeliveries): one creation, one answer each."""
    fake = FakeProvider(pending_polls=1)
    handler = CommandHandler(jetstream_store, {"fake": fake}, policy=FAST, metrics=Metrics())
    await send(jetstream_store, "u2", create())
    command = (await history(jetstream_store, "u2"))[0]
    outcomes = [await handler(Delivery(command, attempt, cast(Msg, None))) for attempt in (1, 2, 3)]
    assert outcomes[0] is not None  # still Pending: come back later
    assert outcomes[1:] == [None, None]
    assert fake.created_total == 1
    assert [type(a) for a in await answers(jetstream_store, "u2")] == [
        InstanceCreated,
        InstanceObserved,
    ]
    assert len(fake.calls) == 3  # create + get, get; the third delivery touched nothing


async def test_lost_created_record_is_healed_by_idempotent_create(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """A crash between provider.create and the InstanceCreated append: the retry asks the
    provider again with the same name and gets the same instance."""

    class LosesFirstCreated:
        lost = False

        async def append(
            self, aggregate: Any, events: Any, expected_seq: int | None = None
        ) -> AppendResult:
            if not self.lost and isinstance(events[0].event, InstanceCreated):
                self.lost = True
                raise StoreUnavailable("connection lost")
            return await jetstream_store.append(aggregate, events, expected_seq)

        async def read(self, aggregate: Any, after_seq: int = 0) -> Any:
            return await jetstream_store.read(aggregate, after_seq)

    fake = FakeProvider()
    async with executor(conn, LosesFirstCreated(), {"fake": fake}):
        await send(jetstream_store, "u3", create())
        got = await answered(jetstream_store, "u3", InstanceObserved)
    assert [c for c in fake.calls if c[0] == "create"] == [("create", "inst-c1")] * 2
    assert fake.created_total == 1
    assert [type(a) for a in got] == [InstanceCreated, InstanceObserved]


async def test_redelivered_answered_command_is_only_acked(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider()
    async with executor(conn, jetstream_store, {"fake": fake}):
        await send(jetstream_store, "u4", create())
        before = await answered(jetstream_store, "u4", InstanceObserved)
        await settled(conn)
    calls = list(fake.calls)
    # A new consumer delivers the whole stream again, as after a lost ack.
    await conn.js.delete_consumer(subjects.PROXY_STREAM, "executor")
    async with executor(conn, jetstream_store, {"fake": fake}):
        await settled(conn)
    assert fake.calls == calls
    assert await answers(jetstream_store, "u4") == before


async def test_unknown_provider_fails_permanently(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider()
    async with executor(conn, jetstream_store, {"fake": fake, "gce": FakeProvider("gce")}):
        await send(jetstream_store, "u5", create(provider="nowhere"))
        got = await answered(jetstream_store, "u5", ProviderFailed)
        await settled(conn)
    assert got == [
        ProviderFailed(
            command_id="c1",
            provider="nowhere",
            operation="create",
            error_class=ErrorClass.PERMANENT,
            message="unknown provider 'nowhere'; configured: fake, gce",
        )
    ]
    assert fake.calls == []


async def test_transient_errors_are_retried(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider()
    fake.inject("create", Transient("503"), times=2)
    fake.inject("get", Transient("timeout"))
    async with executor(conn, jetstream_store, {"fake": fake}):
        await send(jetstream_store, "u6", create())
        got = await answered(jetstream_store, "u6", InstanceObserved)
    assert [type(a) for a in got] == [InstanceCreated, InstanceObserved]
    assert [op for op, _ in fake.calls] == ["create"] * 3 + ["get"] * 2
    assert fake.created_total == 1


async def test_permanent_error_is_answered_once_and_not_retried(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider()
    fake.inject("create", Permanent("image not found"), times=5)
    async with executor(conn, jetstream_store, {"fake": fake}):
        await send(jetstream_store, "u7", create())
        got = await answered(jetstream_store, "u7", ProviderFailed)
        await settled(conn)
    assert got == [
        ProviderFailed(
            command_id="c1",
            provider="fake",
            operation="create",
            error_class=ErrorClass.PERMANENT,
            message="image not found",
        )
    ]
    assert fake.calls == [("create", "inst-c1")]


async def test_quota_is_reported_once_and_retried_slowly(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider()
    fake.inject("create", QuotaExceeded("CPUS quota 24 reached"), times=3)
    async with executor(conn, jetstream_store, {"fake": fake}):
        await send(jetstream_store, "u8", create())
        got = await answered(jetstream_store, "u8", InstanceObserved)
    assert [type(a) for a in got] == [ProviderFailed, InstanceCreated, InstanceObserved]
    quota = got[0]
    assert isinstance(quota, ProviderFailed)
    assert (quota.error_class, quota.message) == (
        ErrorClass.QUOTA_EXCEEDED,
        "CPUS quota 24 reached",
    )
    assert [op for op, _ in fake.calls].count("create") == 4


async def test_not_running_in_time_fails_transient(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider(pending_polls=10**6)
    policy = dataclasses.replace(FAST, create_timeout=0.3)
    async with executor(conn, jetstream_store, {"fake": fake}, policy):
        await send(jetstream_store, "u9", create())
        got = await answered(jetstream_store, "u9", ProviderFailed)
        await settled(conn)
    assert [type(a) for a in got] == [InstanceCreated, ProviderFailed]
    failed = cast(ProviderFailed, got[1])
    assert failed.error_class is ErrorClass.TRANSIENT
    assert failed.provider_id == "fake-inst-c1"
    assert failed.message.startswith("not running after")


async def test_create_timeout_counts_from_the_recorded_creation(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """A restarted executor does not restart the clock: it reads when the instance was made."""
    fake = FakeProvider(pending_polls=10**6)
    await fake.create(CreateRequest("inst-c1", "u10", "crawl", "px", SPEC))
    await send(jetstream_store, "u10", create())
    made = InstanceCreated(command_id="c1", provider="fake", provider_id="fake-inst-c1")
    await jetstream_store.append(subjects.proxy("u10"), [NewEvent(made, "made")])
    command = (await history(jetstream_store, "u10"))[0]

    def in_an_hour() -> datetime:
        return datetime.now(UTC) + timedelta(hours=1)

    handler = CommandHandler(
        jetstream_store, {"fake": fake}, policy=FAST, metrics=Metrics(), clock=in_an_hour
    )
    assert await handler(Delivery(command, 7, cast(Msg, None))) is None
    assert fake.created_total == 1
    failed = (await answers(jetstream_store, "u10"))[-1]
    assert isinstance(failed, ProviderFailed)
    assert failed.message.startswith("not running after 3600 s")


async def test_transient_failures_are_answered_after_retry_for(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """A provider failing for longer than ``retry_for`` gets a Transient answer, not silence."""
    fake = FakeProvider()
    fake.inject("create", Transient("503"), times=2)
    await send(jetstream_store, "u13", create())
    command = (await history(jetstream_store, "u13"))[0]
    handler = CommandHandler(jetstream_store, {"fake": fake}, policy=FAST, metrics=Metrics())
    assert await handler(Delivery(command, 1, cast(Msg, None))) is not None
    assert await answers(jetstream_store, "u13") == []

    def in_an_hour() -> datetime:
        return datetime.now(UTC) + timedelta(hours=1)

    handler.clock = in_an_hour
    assert await handler(Delivery(command, 2, cast(Msg, None))) is None
    (failed,) = await answers(jetstream_store, "u13")
    assert isinstance(failed, ProviderFailed)
    assert (failed.operation, failed.error_class) == ("create", ErrorClass.TRANSIENT)
    assert failed.message.startswith("create still failing after 3600 s: 503")
    assert fake.created_total == 0


async def test_instance_missing_or_stopped_after_create(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider(pending_polls=1)
    handler = CommandHandler(jetstream_store, {"fake": fake}, policy=FAST, metrics=Metrics())
    for uid in ("gone", "stopped"):
        await send(jetstream_store, uid, create())
        command = (await history(jetstream_store, uid))[0]
        assert await handler(Delivery(command, 1, cast(Msg, None))) is not None
        if uid == "gone":
            fake.vanish("fake-inst-c1")
        else:
            fake.stop("fake-inst-c1")
        assert await handler(Delivery(command, 2, cast(Msg, None))) is None
    gone = await answers(jetstream_store, "gone")
    assert gone[-1] == InstanceGone(command_id="c1", provider="fake", provider_id="fake-inst-c1")
    stopped = await answers(jetstream_store, "stopped")
    assert isinstance(stopped[-1], InstanceObserved)
    assert stopped[-1].state is InstanceState.STOPPED


# ------------------------------------------------------------------------ delete and observe


async def test_delete_waits_for_not_found(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider()
    pid = await fake.create(CreateRequest("inst-d", "u11", "crawl", "px", SPEC))
    fake.inject("delete", Transient("connection reset"))
    async with executor(conn, jetstream_store, {"fake": fake}):
        for n, target in enumerate((pid, "fake-never-made")):
            delete = DeleteInstance(command_id=f"d{n}", provider="fake", provider_id=target)
            await send(jetstream_store, "u11", delete)
        await until(lambda: count(jetstream_store, "u11", InstanceGone, 2))
        await settled(conn)
    # d0 waits out its retry while d1 is answered: order across commands is not kept.
    got = sorted(await answers(jetstream_store, "u11"), key=lambda a: a.command_id)
    assert got == [
        InstanceGone(command_id="d0", provider="fake", provider_id=pid),
        InstanceGone(command_id="d1", provider="fake", provider_id="fake-never-made"),
    ]
    assert fake.instances == {}


async def test_observe_answers_what_the_provider_says(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider()
    pid = await fake.create(CreateRequest("inst-o", "u12", "crawl", "px", SPEC))
    async with executor(conn, jetstream_store, {"fake": fake}):
        await send(
            jetstream_store,
            "u12",
            ObserveInstance(command_id="o1", provider="fake", provider_id=pid),
        )
        await until(lambda: count(jetstream_store, "u12", InstanceObserved, 1))
        fake.vanish(pid)
        await send(
            jetstream_store,
            "u12",
            ObserveInstance(command_id="o2", provider="fake", provider_id=pid),
        )
        await until(lambda: count(jetstream_store, "u12", InstanceGone, 1))
    first, second = await answers(jetstream_store, "u12")
    assert isinstance(first, InstanceObserved)
    assert (first.command_id, first.state) == ("o1", InstanceState.RUNNING)
    assert second == InstanceGone(command_id="o2", provider="fake", provider_id=pid)
