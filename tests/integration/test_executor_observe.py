"""The observe sweep, the whole executor service, and a kill -9 in the middle of a create."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, cast

import pytest

from events import subjects
from events.schemas import (
    HealthChanged,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    Phase,
    PhaseChanged,
)
from events.store import EventStore, NewEvent
from services.executor.observe import ObserveSweep
from services.executor.service import ExecutorService
from services.providers.base import (
    Instance,
    Provider,
    Transient,
)
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.metrics import Metrics
from services.runtime.service import ServiceContext
from services.runtime.settings.shared import Settings
from services.testing.provider import FakeProvider
from tests.support.executor_harness import (
    FAST,
    answered,
    answers,
    create,
    declare,
    ready,
    send,
)
from tests.support.file_provider import FileProvider
from tests.support.waiting import until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------ observe sweep


async def test_sweep_records_changes_once(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider()
    sweep = ObserveSweep(conn.js, jetstream_store, {"fake": fake})
    vanishing = await ready(jetstream_store, fake, "v1")
    stopping = await ready(jetstream_store, fake, "s1")
    await declare(jetstream_store, "pending")  # not Ready: the reconciler's business
    first = await sweep.sweep_once()
    assert (first.checked, first.appended) == (2, 0)

    fake.vanish(vanishing)
    fake.stop(stopping)
    second = await sweep.sweep_once()
    assert (second.checked, second.appended, second.conflicts) == (2, 2, 0)
    gone = (await answers(jetstream_store, "v1"))[-1]
    assert isinstance(gone, InstanceGone)
    assert gone.provider_id == vanishing
    assert gone.command_id.startswith("observe-")
    stopped = (await answers(jetstream_store, "s1"))[-1]
    assert isinstance(stopped, InstanceObserved)
    assert stopped.state is InstanceState.STOPPED

    third = await sweep.sweep_once()
    assert (third.checked, third.appended) == (2, 0)
    assert len(await answers(jetstream_store, "v1")) == 3
    await sweep.projector.close()


async def test_sweep_skips_a_failing_provider_for_the_round(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider()
    sweep = ObserveSweep(conn.js, jetstream_store, {"fake": fake}, concurrency=1)
    for uid in ("f1", "f2"):
        fake.vanish(await ready(jetstream_store, fake, uid))
    fake.inject("get", Transient("API unavailable"))
    first = await sweep.sweep_once()
    assert (first.checked, first.appended, first.skipped_providers) == (1, 0, {"fake"})
    second = await sweep.sweep_once()
    assert (second.checked, second.appended, second.skipped_providers) == (2, 2, set())
    await sweep.projector.close()


async def test_sweep_drops_an_observation_the_log_overtook(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """Something happens to the proxy while the provider answers: the answer may be stale."""
    fake = FakeProvider()
    pid = await ready(jetstream_store, fake, "r1")
    fake.vanish(pid)

    class Racing:
        name, type = "fake", "fake"

        async def get(self, provider_id: str) -> Instance:
            racing = HealthChanged(healthy=False, reason="ProbeFailed")
            await jetstream_store.append(subjects.proxy("r1"), [NewEvent(racing, "race")])
            return await fake.get(provider_id)

    sweep = ObserveSweep(conn.js, jetstream_store, {"fake": cast(Provider, Racing())})
    first = await sweep.sweep_once()
    assert (first.appended, first.conflicts) == (0, 1)
    assert not any(isinstance(a, InstanceGone) for a in await answers(jetstream_store, "r1"))
    second = await sweep.sweep_once()  # the racing append is a duplicate now
    assert (second.appended, second.conflicts) == (1, 0)
    await sweep.projector.close()


# ------------------------------------------------------------------------ the whole service


async def test_service_runs_commands_and_sweeps(
    conn: Connection, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    fake = FakeProvider(pending_polls=1)
    metrics = Metrics()
    ctx = ServiceContext(settings=Settings(), conn=conn, store=jetstream_store, metrics=metrics)
    service = ExecutorService(
        None, tmp_path, observe_interval=0.05, providers={"fake": fake}, policy=FAST
    )
    task = asyncio.create_task(service.run(ctx))
    try:
        await declare(jetstream_store, "w1")
        await send(jetstream_store, "w1", create())
        got = await answered(jetstream_store, "w1", InstanceObserved)
        instance = cast(InstanceObserved, got[-1])
        ready_now = PhaseChanged(phase=Phase.READY, provider_id=instance.provider_id)
        await jetstream_store.append(subjects.proxy("w1"), [NewEvent(ready_now, "w1-ready")])
        fake.vanish(instance.provider_id)
        await answered(jetstream_store, "w1", InstanceGone)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert fake.closed
    requests = metrics.provider_requests.labels("fake", "create", "ok")._value.get()
    assert requests == 1


# ---------------------------------------------------------------------------------- kill -9


async def test_killed_mid_create_makes_one_instance_and_answers(
    nats_server: EmbeddedNatsServer,
    conn: Connection,
    jetstream_store: JetStreamEventStore,
    tmp_path: Path,
) -> None:
    state = tmp_path / "instances.json"
    disk = FileProvider(state)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    logs = contextlib.ExitStack()

    async def worker(create_delay: float) -> asyncio.subprocess.Process:
        log = logs.enter_context((tmp_path / f"worker-{create_delay}.log").open("w"))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.executor_worker",
            nats_server.url,
            str(state),
            str(create_delay),
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env=env,
            cwd=ROOT,
        )
        assert proc.stdout is not None
        assert (await proc.stdout.readline()).strip() == b"ready"
        return proc

    with logs:
        await _kill_mid_create(jetstream_store, disk, worker)


async def _kill_mid_create(
    store: EventStore,
    disk: FileProvider,
    worker: Callable[[float], Coroutine[Any, Any, asyncio.subprocess.Process]],
) -> None:
    jetstream_store = store
    first = await worker(30.0)
    try:
        await send(jetstream_store, "k1", create(provider="disk"))

        async def made() -> bool:
            return bool(disk.load()["instances"])

        await until(made)
    finally:
        first.send_signal(signal.SIGKILL)
        await first.wait()
    assert await answers(jetstream_store, "k1") == [], "the kill should land before any answer"

    second = await worker(0.0)
    try:
        got = await answered(jetstream_store, "k1", InstanceObserved)
    finally:
        second.send_signal(signal.SIGKILL)
        await second.wait()
    assert [type(a) for a in got] == [InstanceCreated, InstanceObserved]
    assert disk.load()["created_total"] == 1
    assert list(disk.load()["instances"]) == ["disk-inst-c1"]
