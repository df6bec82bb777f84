"""Events for the CLI's readers (``events``, ``streams info``) to show: good ones, and messages
no current reader can decode."""

from __future__ import annotations

import json
from typing import Any

from events import subjects
from events.codec import HDR_EVENT_TYPE, HDR_MSG_ID
from events.schemas import (
    CreateInstance,
    InstanceObserved,
    InstanceState,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
)
from events.store import NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection


async def seed_proxy(store: JetStreamEventStore, uid: str) -> None:
    spec = ProxySpec(provider="local")
    await store.append(
        subjects.proxy(uid),
        [
            NewEvent(
                ProxyDeclared(uid=uid, namespace="crawl", name=f"n-{uid}", spec=spec), f"{uid}-d"
            ),
            NewEvent(
                CreateInstance(
                    command_id="c1", provider="local", instance_name=f"i-{uid}", spec=spec
                ),
                f"{uid}-c1",
            ),
            NewEvent(
                InstanceObserved(
                    command_id="c1",
                    provider="local",
                    provider_id=f"i-{uid}",
                    state=InstanceState.RUNNING,
                    ip="10.1.2.3",
                ),
                f"{uid}-o1",
            ),
            NewEvent(PhaseChanged(phase=Phase.READY, ip="10.1.2.3"), f"{uid}-ready"),
        ],
    )


async def publish_raw(conn: Connection, subject: str, data: bytes, event_type: str) -> None:
    headers = {HDR_EVENT_TYPE: event_type, HDR_MSG_ID: f"raw-{subject}-{event_type}"}
    await conn.js.publish(subject, data, headers=headers)


async def seed_with_poison(conn: Connection, store: JetStreamEventStore) -> None:
    """p1 gets four good events, one from a newer writer and one broken; p2 one good event."""
    await seed_proxy(store, "p1")
    await publish_raw(conn, "proxy.p1.status", b'{"type":"Teleported","to":"moon"}', "Teleported")
    await publish_raw(
        conn, "proxy.p1.health", b'{"type":"HealthChanged","healthy":3}', "HealthChanged"
    )
    await seed_proxy(store, "p2")


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]
