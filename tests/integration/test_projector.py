"""The projector runtime on a real stream: rebuild equals live, read-your-writes."""

from __future__ import annotations

import asyncio

import pytest

from events import subjects
from events.schemas import HealthChanged, Phase, PhaseChanged, ProxyDeclared, ProxySpec
from events.store import NewEvent, Recorded
from projections.proxy import ProxyView, apply
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.projector import Projector
from services.runtime.nats.connection import Connection

pytestmark = pytest.mark.integration


async def declare(store: JetStreamEventStore, uid: str) -> None:
    event = ProxyDeclared(uid=uid, namespace="ns", name=uid, spec=ProxySpec(provider="local"))
    await store.append(subjects.proxy(uid), [NewEvent(event, f"{uid}-declared")])


async def test_rebuild_equals_live(conn: Connection, jetstream_store: JetStreamEventStore) -> None:
    for i in range(50):
        await declare(jetstream_store, f"p{i}")
    live: Projector[ProxyView] = Projector(conn.js, "PROXY", "proxy.*.*", apply, batch=16)
    assert await live.catch_up() == 50
    task = asyncio.create_task(live.run())
    try:
        last = 0
        for i in range(0, 50, 5):
            change = PhaseChanged(phase=Phase.READY, url=f"http://127.0.0.1:{3000 + i}")
            result = await jetstream_store.append(
                subjects.proxy(f"p{i}"), [NewEvent(change, f"p{i}-ready")]
            )
            last = result.last_seq
        await live.wait_for(last)
        assert live.views["p10"].phase is Phase.READY
        assert live.views["p10"].url == "http://127.0.0.1:3010"
        assert live.views["p11"].phase is Phase.PENDING
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await live.close()

    rebuilt: Projector[ProxyView] = Projector(conn.js, "PROXY", "proxy.*.*", apply)
    await rebuilt.catch_up()
    await rebuilt.close()
    assert rebuilt.views == live.views
    assert rebuilt.last_seq == live.last_seq


async def test_poison_event_is_skipped_by_views(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await declare(jetstream_store, "ok")
    await conn.js.publish(
        "proxy.ok.health", b"{broken", headers={"Egress-Event-Type": "HealthChanged"}
    )
    await jetstream_store.append(
        subjects.proxy("ok"), [NewEvent(HealthChanged(healthy=True), "h1")]
    )
    projector: Projector[ProxyView] = Projector(conn.js, "PROXY", "proxy.*.*", apply)
    await projector.catch_up()
    await projector.close()
    assert projector.skipped == 1
    assert projector.views["ok"].healthy is True


async def test_a_poison_event_last_still_moves_the_view_to_its_sequence(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """Writers append with the view's last sequence as expectation: a view stuck before a
    poison message would conflict for ever. When the poison is an aggregate's first event
    there is no view: a proxy exists from its declaration
    (docs/decisions/0095-the-console-and-the-api-bound.md), which is appended after the aggregate's
    own last sequence."""
    await declare(jetstream_store, "ok")
    ack = await conn.js.publish(
        "proxy.ok.status", b"{not json", headers={"Egress-Event-Type": "PhaseChanged"}
    )
    first = await conn.js.publish("proxy.fresh.status", b'{"type":"PhaseChanged","phase":1}')
    projector: Projector[ProxyView] = Projector(conn.js, "PROXY", "proxy.*.*", apply)
    await projector.catch_up()
    await projector.close()
    assert projector.skipped == 2
    assert projector.views["ok"].last_seq == ack.seq
    assert first.seq > ack.seq
    assert "fresh" not in projector.views
    change = PhaseChanged(phase=Phase.READY)
    appended = await jetstream_store.append(
        subjects.proxy("ok"), [NewEvent(change, "ok-ready")], expected_seq=ack.seq
    )
    assert appended.last_seq > ack.seq


async def test_an_event_the_fold_cannot_apply_is_skipped_not_raised(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """A fold that raises on an event (an overflow, a broken invariant) does not stop the
    projector: the event counts as unusable and the view moves past it."""
    await declare(jetstream_store, "a")
    await jetstream_store.append(subjects.proxy("a"), [NewEvent(HealthChanged(healthy=True), "h")])
    await declare(jetstream_store, "b")

    def fussy(view: ProxyView | None, recorded: Recorded) -> ProxyView:
        if isinstance(recorded.event, HealthChanged):
            raise OverflowError("date value out of range")
        return apply(view, recorded)

    projector: Projector[ProxyView] = Projector(conn.js, "PROXY", "proxy.*.*", fussy)
    await projector.catch_up()
    await projector.close()
    assert projector.skipped == 1
    assert projector.applied == 2
    assert projector.views["a"].last_seq == 2
    assert projector.views["a"].healthy is None
    assert set(projector.views) == {"a", "b"}


async def test_resumes_after_its_consumer_is_lost(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """A lost ephemeral consumer is replaced from the last applied sequence: nothing twice."""
    await declare(jetstream_store, "a")
    projector: Projector[ProxyView] = Projector(conn.js, "PROXY", "proxy.*.*", apply)
    await projector.catch_up()
    for info in await conn.js.consumers_info("PROXY"):
        await conn.js.delete_consumer("PROXY", info.name)
    await declare(jetstream_store, "b")
    for _ in range(20):
        await projector.step(no_wait=True)
        if "b" in projector.views:
            break
    await projector.close()
    assert set(projector.views) == {"a", "b"}
    assert projector.applied == 2


async def test_catch_up_ends_with_a_late_status_message_queued(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    """A fetch that gives up before the server's "request timeout" answer leaves that answer in
    the local queue, where no fetch ever returns it: catch_up must not count it as an event."""
    for i in range(3):
        await declare(jetstream_store, f"s{i}")
    projector: Projector[ProxyView] = Projector(conn.js, "PROXY", "proxy.*.*", apply)
    try:
        assert await projector.catch_up() == 3
        reader = projector._reader
        parts = (0, 0)
        for _ in range(100):
            await reader.fetch(0.001)
            await asyncio.sleep(0.02)
            parts = await reader.pending_parts()
            if parts[1]:
                break
        assert parts[0] == 0
        assert parts[1] > 0, "no late status message could be left queued"
        async with asyncio.timeout(10):
            assert await projector.catch_up() == 0
        await declare(jetstream_store, "s3")
        async with asyncio.timeout(10):
            assert await projector.catch_up() == 1
        assert set(projector.views) == {"s0", "s1", "s2", "s3"}
    finally:
        await projector.close()
