"""A rotation survives a SIGKILL of the reconciler or the executor at its riskiest moments and
converges with exactly one instance, its lease switched
(docs/decisions/0085-a-fresh-ip-without-downtime.md).

The instances here are the fake's or the file provider's (the Squid is not the point), and
the test plays the health service: it records the replacement's verdict, as the prober would
after probing ``projections.proxy.probe_target``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.reconciler.service import ReconcilerService
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from services.testing.provider import FakeProvider
from tests.support.file_provider import FileProvider
from tests.support.lifecycle import fleet, start, view
from tests.support.rotation import (
    declared,
    judge_healthy,
    leased,
    promoted,
    replacement_running,
    request_rotation,
    serving,
    token,
)
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
DRAIN = "1.5"


@contextlib.asynccontextmanager
async def process(*args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()


def reconciler(url: str) -> contextlib.AbstractAsyncContextManager[asyncio.subprocess.Process]:
    return process(
        "-m",
        "services.cli.main",
        "run",
        "reconciler",
        "--nats-url",
        url,
        "--metrics-port",
        "0",
        "--rotation-drain",
        DRAIN,
    )


async def kill(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGKILL)
    await proc.wait()


async def test_reconciler_killed_twice_mid_rotation_converges_with_one_instance(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    fake = FakeProvider(pending_polls=2)
    store = jetstream_store
    async with fleet(nats_server.url, {"fake": fake}, reconcilers=0):
        async with reconciler(nats_server.url) as first:
            uid = await declared(store, "fake")
            before = await serving(store, uid)
            first_token = await leased(store, uid)
            await request_rotation(store, uid)
            new = await replacement_running(store, uid)
            # Killed with the replacement up and not judged: nothing may switch or go.
            await kill(first)
        assert fake.live_per_owner()[uid] == 2
        await judge_healthy(store, uid, new)
        async with reconciler(nats_server.url) as second:
            await until(lambda: promoted(store, uid), timeout=60)
            # Killed in the drain: promoted, the old instance not deleted yet.
            await kill(second)
        assert fake.live_per_owner()[uid] == 2
        async with reconciler(nats_server.url):

            async def converged() -> bool:
                return fake.live_per_owner().get(uid) == 1

            await until(converged, timeout=60)
        after = await view(store, uid)
    assert after is not None
    assert (after.provider_id, after.replacement) == (new, None)
    assert after.provider_id != before.provider_id
    assert after.rotation is not None
    assert after.rotation.state == "completed"
    assert await token(store, uid) > first_token
    assert fake.created_total == 2
    assert [i.provider_id for i in await fake.list_by_tag()] == [new]


async def test_executor_killed_mid_replacement_create_converges_with_one_instance(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    state = tmp_path / "instances.json"
    disk = FileProvider(state)
    store = jetstream_store
    tasks: list[asyncio.Task[None]] = []

    def executor(
        create_delay: float,
    ) -> contextlib.AbstractAsyncContextManager[asyncio.subprocess.Process]:
        return process(
            "-m", "tests.support.executor_worker", nats_server.url, str(state), str(create_delay)
        )

    try:
        await start(nats_server.url, ReconcilerService(rotation_drain=float(DRAIN)), tasks)
        async with executor(0.0) as first:
            assert first.stdout is not None
            assert (await first.stdout.readline()).strip() == b"ready"
            uid = await declared(store, "disk")
            before = await serving(store, uid)
            first_token = await leased(store, uid)
            await kill(first)
        async with executor(30.0) as slow:
            assert slow.stdout is not None
            assert (await slow.stdout.readline()).strip() == b"ready"
            await request_rotation(store, uid)

            async def made() -> bool:
                return len(disk.load()["instances"]) == 2

            await until(made, timeout=60)
            # Killed inside the provider's create: the replacement exists, unrecorded.
            await kill(slow)
        async with executor(0.0) as second:
            assert second.stdout is not None
            assert (await second.stdout.readline()).strip() == b"ready"
            new = await replacement_running(store, uid)
            await judge_healthy(store, uid, new)

            async def converged() -> bool:
                return list(disk.load()["instances"]) == [new]

            await until(converged, timeout=60)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    after = await view(store, uid)
    assert after is not None
    assert after.provider_id == new != before.provider_id
    assert disk.load()["created_total"] == 2
    assert await token(store, uid) > first_token
