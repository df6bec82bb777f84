"""The batched pull (services.runtime.eventlog.batched) on a real stream: every event once and in
order, from a start sequence, also when its consumer is deleted under it, when something else
writes to its inbox, and when the stream holds nothing more for a while."""

from __future__ import annotations

import pytest

from bench.scale_startup import fill_startup
from services.runtime.eventlog.batched import BatchedPull
from services.runtime.nats.connection import Connection

pytestmark = pytest.mark.integration


async def read_all(pull: BatchedPull, until: int, *, each: object = None) -> list[int]:
    seen: list[int] = []
    empty = 0
    while (not seen or seen[-1] < until) and empty < 5:
        msgs = await pull.fetch(0.5)
        empty = 0 if msgs else empty + 1
        seen += [m.metadata.sequence.stream for m in msgs]
        if callable(each):
            await each(len(seen))
    return seen


async def test_every_event_once_in_order_from_the_start_sequence(conn: Connection) -> None:
    await fill_startup(conn, 10, 1200, seed=1)
    pull = BatchedPull(conn.nc, conn.js, "LEASE", "lease.*", batch=100)
    pull.last_seq = 200
    try:
        assert await read_all(pull, 1200) == list(range(201, 1201))
        assert pull.restarts == 0
        assert await pull.fetch(0.2) == []  # nothing more: an empty answer, no restart
        assert pull.restarts == 0
    finally:
        await pull.close()


async def test_a_consumer_deleted_under_it_is_replaced_after_the_last_event_read(
    conn: Connection,
) -> None:
    await fill_startup(conn, 10, 1000, seed=2)
    pull = BatchedPull(conn.nc, conn.js, "LEASE", "lease.*", batch=50)
    deleted = False

    async def delete_once(count: int) -> None:
        nonlocal deleted
        if count >= 300 and not deleted:
            deleted = True
            await conn.js.delete_consumer("LEASE", pull._consumer)

    try:
        assert await read_all(pull, 1000, each=delete_once) == list(range(1, 1001))
        assert pull.restarts >= 1
    finally:
        await pull.close()


async def test_a_stranger_writing_to_its_inbox_is_not_an_event(conn: Connection) -> None:
    await fill_startup(conn, 5, 400, seed=3)
    pull = BatchedPull(conn.nc, conn.js, "LEASE", "lease.*", batch=100)
    try:
        first = await pull.fetch(1.0)
        assert first
        assert pull._sub is not None
        await conn.nc.publish(pull._sub.subject, b"not an event")
        rest = await read_all(pull, 400)
        seen = [m.metadata.sequence.stream for m in first] + rest
        assert seen == list(range(1, 401))
    finally:
        await pull.close()
