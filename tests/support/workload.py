"""A tiny workload for consumer tests: health events in, one status event out per input.

The effect's msg id derives from the input's, so a redelivered input that is handled again stores
nothing new: ``effects`` counts what really happened.
"""

from __future__ import annotations

import asyncio

from events import subjects
from events.schemas import HealthChanged, Phase, PhaseChanged
from events.store import EventStore, NewEvent, derive_msg_id
from services.runtime.nats.consumer import ConsumerSpec, Delivery, Outcome


def spec(durable: str = "workers", **overrides: object) -> ConsumerSpec:
    values: dict[str, object] = {
        "stream": subjects.PROXY_STREAM,
        "durable": durable,
        "filter_subjects": ("proxy.*.health",),
        "fetch_timeout": 0.2,
    }
    values.update(overrides)
    return ConsumerSpec(**values)  # type: ignore[arg-type]


async def publish_inputs(store: EventStore, uids: list[str], per_uid: int = 1) -> None:
    for uid in uids:
        news = [
            NewEvent(HealthChanged(healthy=True, reason=f"in-{i}"), msg_id=f"in-{uid}-{i}")
            for i in range(per_uid)
        ]
        await store.append(subjects.proxy(uid), news)


def effect_handler(store: EventStore, delay: float = 0.0) -> object:
    async def handle(delivery: Delivery) -> Outcome:
        if delay:
            await asyncio.sleep(delay)
        uid = subjects.proxy_uid_of(delivery.recorded.subject)
        effect = PhaseChanged(phase=Phase.READY, reason=delivery.recorded.msg_id)
        await store.append(
            subjects.proxy(uid),
            [
                NewEvent(
                    effect,
                    derive_msg_id("effect", delivery.recorded.msg_id),
                    delivery.recorded.msg_id,
                )
            ],
        )
        return None

    return handle


async def effects(store: EventStore, uids: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for uid in uids:
        history = await store.read(subjects.proxy(uid))
        out[uid] = [r.event.reason for r in history.events if isinstance(r.event, PhaseChanged)]
    return out
