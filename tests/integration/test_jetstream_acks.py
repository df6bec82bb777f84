"""What the JetStream store makes of the answer to an append, whatever comes back on its reply
subject (docs/decisions/0165-deliveries-settled-inline.md: the store waits for its own
acknowledgements), against a real nats-server."""

from __future__ import annotations

from typing import Any

import pytest

from events import subjects
from events.errors import ConcurrencyError, EventStoreError, StoreUnavailable
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from tests.contract.event_store import declared, health

pytestmark = pytest.mark.integration


def answered_with(store: JetStreamEventStore, conn: Connection, answer: bytes | None) -> list[str]:
    """Every publish with a reply subject is answered with ``answer`` (None: not at all) in
    place of the stream; the subjects it would have gone to, in order."""
    diverted: list[str] = []
    real = conn.nc.publish

    async def publish(subject: str, payload: bytes = b"", reply: str = "", **kwargs: Any) -> None:
        if not reply:
            await real(subject, payload, reply=reply, **kwargs)
            return
        diverted.append(subject)
        if answer is not None:
            await real(reply, answer)

    conn.nc.publish = publish  # type: ignore[method-assign,assignment]
    return diverted


@pytest.mark.parametrize(
    "answer",
    [b"not json", b"", b"[1, 2]", b'{"seq": "three"}', b'{"error": "nope"}', b"\xff\xfe"],
    ids=["not-json", "empty", "a-list", "seq-not-a-number", "error-not-an-object", "binary"],
)
async def test_an_unreadable_acknowledgement_fails_the_append(
    conn: Connection, answer: bytes
) -> None:
    store = JetStreamEventStore(conn.nc, conn.js)
    agg = subjects.proxy("garbled")
    diverted = answered_with(store, conn, answer)
    with pytest.raises(EventStoreError, match="unreadable acknowledgement"):
        await store.append(agg, [declared("garbled")], expected_seq=0)
    assert diverted == ["proxy.garbled.declared"]


async def test_a_refusal_other_than_a_conflict_says_what_the_server_said(
    conn: Connection,
) -> None:
    store = JetStreamEventStore(conn.nc, conn.js)
    refusal = b'{"error": {"code": 503, "err_code": 10077, "description": "maximum messages"}}'
    answered_with(store, conn, refusal)
    with pytest.raises(EventStoreError, match="maximum messages") as caught:
        await store.append(subjects.proxy("full"), [declared("full")], expected_seq=0)
    assert not isinstance(caught.value, ConcurrencyError | StoreUnavailable)


async def test_an_append_without_an_answer_is_tried_again_then_given_up(
    conn: Connection,
) -> None:
    store = JetStreamEventStore(conn.nc, conn.js, timeout=0.2, attempts=2)
    diverted = answered_with(store, conn, None)
    with pytest.raises(StoreUnavailable, match="no answer after 2 attempts"):
        await store.append(subjects.proxy("silent"), [health(1)])
    assert diverted == ["proxy.silent.health", "proxy.silent.health"]


async def test_the_stream_s_own_answers_still_come_through(conn: Connection) -> None:
    """The same store's reads and appends share its reply subscription."""
    store = JetStreamEventStore(conn.nc, conn.js)
    agg = subjects.proxy("shared")
    first = await store.append(agg, [declared("shared"), health(1)], expected_seq=0)
    again = await store.append(agg, [declared("shared"), health(1)], expected_seq=0)
    assert (again.seqs, again.duplicates) == (first.seqs, 2)
    with pytest.raises(ConcurrencyError):
        await store.append(agg, [health(2)], expected_seq=first.seqs[0])
    assert [r.msg_id for r in (await store.read(agg)).events] == ["shared-declared", "health-1"]
