"""Shared by the executor's integration tests: fast delays, publishing commands, reading answers.

The polling helpers read the log, not the handler's internals: what a test asserts is what the
reconciler will see.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nats.js.errors import NotFoundError

from events import subjects
from events.schemas import (
    CreateInstance,
    Event,
    InstanceCreated,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
)
from events.store import EventStore, NewEvent, Recorded
from projections.commands import Answer, Command
from services.executor.commands import CommandHandler
from services.executor.pure.answers import observed
from services.executor.pure.policy import CommandPolicy
from services.executor.service import consumer_spec
from services.providers.base import CreateRequest, Provider
from services.runtime.nats.connection import Connection
from services.runtime.nats.consumer import ConsumerLoop
from services.runtime.observability.metrics import Metrics
from tests.support.waiting import until

FAST = CommandPolicy(
    poll_initial=0.02, poll_max=0.1, backoff_base=0.02, backoff_max=0.1, quota_delay=0.1
)
SPEC = ProxySpec(provider="fake")


async def declare(store: EventStore, uid: str, provider: str = "") -> None:
    """A Proxy declared on ``provider`` (the fake by default), as the watcher would declare it."""
    spec = ProxySpec(provider=provider) if provider else SPEC
    declared = ProxyDeclared(uid=uid, namespace="crawl", name=f"px-{uid}", spec=spec)
    await store.append(subjects.proxy(uid), [NewEvent(declared, f"declared-{uid}")])


async def send(store: EventStore, uid: str, command: Command) -> None:
    msg_id = f"cmd-{uid}-{command.command_id}"
    await store.append(subjects.proxy(uid), [NewEvent(command, msg_id)])


def create(command_id: str = "c1", provider: str = "fake") -> CreateInstance:
    return CreateInstance(
        command_id=command_id, provider=provider, instance_name=f"inst-{command_id}", spec=SPEC
    )


async def history(store: EventStore, uid: str) -> list[Recorded]:
    return (await store.read(subjects.proxy(uid))).events


async def answers(store: EventStore, uid: str) -> list[Answer]:
    """What the executor recorded for the proxy, oldest first."""
    return [r.event for r in await history(store, uid) if isinstance(r.event, Answer)]


async def answered(store: EventStore, uid: str, kind: type[Event]) -> list[Answer]:
    """Wait until an answer of ``kind`` is recorded, then return every answer."""

    async def seen() -> bool:
        return any(isinstance(a, kind) for a in await answers(store, uid))

    await until(seen)
    return await answers(store, uid)


@asynccontextmanager
async def executor(
    conn: Connection,
    store: EventStore,
    providers: dict[str, Provider],
    policy: CommandPolicy = FAST,
) -> AsyncIterator[ConsumerLoop]:
    handler = CommandHandler(store, providers, policy=policy, metrics=Metrics())
    spec = dataclasses.replace(
        consumer_spec(concurrency=8), fetch_timeout=0.1, retry_base=0.05, retry_max=0.2
    )
    loop = ConsumerLoop(conn, spec, handler, store=store, metrics=Metrics())
    task = asyncio.create_task(loop.run())
    try:
        yield loop
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def settled(conn: Connection) -> None:
    """Every command acknowledged: nothing pending, nothing waiting for a redelivery."""

    async def done() -> bool:
        try:
            info = await conn.js.consumer_info(subjects.PROXY_STREAM, "executor")
        except NotFoundError:  # the loop has not created it yet
            return False
        return bool(info.num_pending == 0 and info.num_ack_pending == 0)

    await until(done)


async def count(store: EventStore, uid: str, kind: type[Event], n: int) -> bool:
    return sum(isinstance(a, kind) for a in await answers(store, uid)) >= n


async def ready(store: EventStore, provider: Provider, uid: str) -> str:
    """A proxy the reconciler has seen running: declared, created, observed, Ready."""
    await declare(store, uid)
    pid = await provider.create(CreateRequest(f"inst-{uid}", uid, "crawl", uid, SPEC))
    instance = await provider.get(pid)
    events: list[Event] = [
        InstanceCreated(command_id="c1", provider="fake", provider_id=pid),
        observed("c1", "fake", instance),
        PhaseChanged(phase=Phase.READY, provider_id=pid, ip=instance.ip, url=instance.url),
    ]
    await store.append(
        subjects.proxy(uid), [NewEvent(e, f"{uid}-{i}") for i, e in enumerate(events)]
    )
    return pid
