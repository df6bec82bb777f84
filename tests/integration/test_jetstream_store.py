from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest
from nats.aio.msg import Msg

from events import subjects
from events.errors import ConcurrencyError
from services.runtime.eventlog import answers
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from tests.contract.event_store import (
    EventStoreContract,
    RawAppend,
    command,
    declared,
    health,
    status,
)

pytestmark = pytest.mark.integration


class TestJetStreamEventStore(EventStoreContract):
    @pytest.fixture
    def store(self, conn: Connection) -> JetStreamEventStore:
        return JetStreamEventStore(conn.nc, conn.js, read_batch=700)

    @pytest.fixture
    def raw_append(self, conn: Connection) -> RawAppend:
        async def append(stream: str, subject: str, data: bytes, headers: dict[str, str]) -> int:
            ack = await conn.js.publish(subject, data, headers=headers, stream=stream)
            return int(ack.seq)

        return append


# ------------------------------------------------------------------ how a proxy's read is made


Request = dict[str, Any]
Answer = tuple[list[Msg], int, Mapping[str, str] | None]
Hook = Callable[[Request, Answer], Awaitable[Answer]]


def recording(store: JetStreamEventStore, hook: Hook | None = None) -> list[Request]:
    """Every direct get the store sends, in order; ``hook`` may change an answer, as a server
    answering from another moment (or another replica) would."""
    sent: list[Request] = []
    real = store._direct_get_eob

    async def direct_get(stream: str, request: Request) -> Answer:
        sent.append(request)
        answer = await real(stream, request)
        return await hook(request, answer) if hook else answer

    store._direct_get_eob = direct_get  # type: ignore[method-assign]
    return sent


def seq_of(msg: Msg) -> int:
    return int((msg.headers or {})["Nats-Sequence"])


async def mixed(store: JetStreamEventStore, uid: str) -> list[int]:
    appended = [declared(uid), command(1), health(1), status(1), health(2)]
    return (await store.append(subjects.proxy(uid), appended, expected_seq=0)).seqs


async def test_a_proxy_read_uses_only_literal_subjects(conn: Connection) -> None:
    """A wildcard ``next_by_subj`` walks the stream from the read's start, so its cost grows
    with the whole stream; literal subjects use the server's per-subject index."""
    store = JetStreamEventStore(conn.nc, conn.js)
    seqs = await mixed(store, "lit")
    sent = recording(store)

    history = await store.read(subjects.proxy("lit"))

    assert [r.seq for r in history.events] == seqs
    reads = [r["next_by_subj"] for r in sent if "next_by_subj" in r]
    # Every subject that holds an event, each once; ``instance`` holds none, so it is not read.
    held = ["proxy.lit.cmd", "proxy.lit.declared", "proxy.lit.health", "proxy.lit.status"]
    assert sorted(reads) == held
    assert set(reads) <= set(subjects.proxy("lit").literal_subjects)
    assert [r["multi_last"] for r in sent if "multi_last" in r] == [["proxy.lit.>"]]


async def test_a_read_after_a_kept_sequence_asks_only_the_subjects_written_since(
    conn: Connection,
) -> None:
    """A reconcile from a kept state reads the events after it: ``multi_last`` tells which
    subjects have any, and only those are read (two requests here, not one per category)."""
    store = JetStreamEventStore(conn.nc, conn.js)
    seqs = await mixed(store, "kept")
    sent = recording(store)

    history = await store.read(subjects.proxy("kept"), after_seq=seqs[2])

    assert [r.seq for r in history.events] == seqs[3:]
    assert history.last_seq == seqs[-1]
    reads = [(r["next_by_subj"], r["seq"]) for r in sent if "next_by_subj" in r]
    assert sorted(reads) == [("proxy.kept.health", seqs[2] + 1), ("proxy.kept.status", seqs[2] + 1)]
    assert len(sent) == 3

    sent.clear()
    nothing = await store.read(subjects.proxy("kept"), after_seq=seqs[-1])
    assert (nothing.events, nothing.last_seq) == ([], seqs[-1])
    assert [list(r) for r in sent] == [["multi_last", "batch"]], "only the snapshot is asked"


async def test_a_subject_read_from_before_the_snapshot_is_read_again(conn: Connection) -> None:
    """The reads of one proxy's subjects go out together and may be answered at different
    moments; the one answered before the newest health event was stored is read again."""
    store = JetStreamEventStore(conn.nc, conn.js)
    seqs = await mixed(store, "late")

    async def before_the_newest(request: Request, answer: Answer) -> Answer:
        if request.get("next_by_subj") == "proxy.late.health" and request["seq"] == 1:
            got, _, eob = answer
            return [m for m in got if seq_of(m) < seqs[-1]], 0, eob
        return answer

    sent = recording(store, before_the_newest)
    history = await store.read(subjects.proxy("late"))

    assert [r.seq for r in history.events] == seqs
    assert history.last_seq == seqs[-1]
    again = [r for r in sent if r.get("next_by_subj") == "proxy.late.health"]
    assert [r["seq"] for r in again] == [1, seqs[2] + 1]  # after health-1, where it stopped


async def test_events_stored_after_the_snapshot_wait_for_the_next_read(conn: Connection) -> None:
    """An event appended after ``multi_last`` answered but before a subject's read is not in
    the read, and neither is its sequence: the next append, decided without it, conflicts."""
    store = JetStreamEventStore(conn.nc, conn.js)
    seqs = await mixed(store, "moving")
    snapshot_taken = asyncio.Event()
    newer: list[int] = []

    async def append_in_between(request: Request, answer: Answer) -> Answer:
        if "multi_last" in request:
            ack = await conn.js.publish("proxy.moving.cmd", b"{}", headers={"Nats-Msg-Id": "x"})
            newer.append(ack.seq)
            snapshot_taken.set()
        return answer

    real = store._direct_get_eob

    async def reads_wait_for_the_snapshot(stream: str, request: Request) -> Answer:
        if "next_by_subj" in request:
            await snapshot_taken.wait()
        return await real(stream, request)

    store._direct_get_eob = reads_wait_for_the_snapshot  # type: ignore[method-assign]
    recording(store, append_in_between)
    history = await store.read(subjects.proxy("moving"))

    assert [r.seq for r in history.events] == seqs
    assert history.last_seq == seqs[-1] < newer[0]
    with pytest.raises(ConcurrencyError):
        await store.append(subjects.proxy("moving"), [status(2)], expected_seq=history.last_seq)


async def test_a_subject_that_stays_behind_falls_back_to_the_wildcard(conn: Connection) -> None:
    """A replica that keeps answering from before the snapshot (it lags the one that answered
    ``multi_last``): after a few tries the read takes the wildcard, one consistent prefix."""
    store = JetStreamEventStore(conn.nc, conn.js)
    seqs = await mixed(store, "behind")

    async def never_the_health(request: Request, answer: Answer) -> Answer:
        if request.get("next_by_subj") == "proxy.behind.health":
            return [], 0, None
        return answer

    sent = recording(store, never_the_health)
    history = await store.read(subjects.proxy("behind"))

    assert [r.seq for r in history.events] == seqs
    assert sent[-1]["next_by_subj"] == "proxy.behind.>"


@pytest.mark.parametrize("answer", ["refused", "no-upto"])
async def test_a_server_without_multi_last_reads_the_wildcard(
    conn: Connection, answer: str
) -> None:
    """A server before 2.11 refuses ``multi_last`` (or answers without ``Nats-UpTo-Sequence``):
    the read is then one wildcard read, as before."""
    store = JetStreamEventStore(conn.nc, conn.js)
    seqs = await mixed(store, "old")

    async def old_server(request: Request, got: Answer) -> Answer:
        if "multi_last" not in request:
            return got
        if answer == "refused":
            raise answers.Refused("read of PROXY failed: 408 Bad Request")
        return got[0], 0, {"Status": "204"}

    sent = recording(store, old_server)
    history = await store.read(subjects.proxy("old"))

    assert [r.seq for r in history.events] == seqs
    assert sent[-1]["next_by_subj"] == "proxy.old.>"


async def test_nothing_after_the_sequence_keeps_it_as_last(conn: Connection) -> None:
    store = JetStreamEventStore(conn.nc, conn.js)
    seqs = await mixed(store, "ahead")
    history = await store.read(subjects.proxy("ahead"), after_seq=seqs[-1] + 10)
    assert (history.events, history.last_seq) == ([], seqs[-1] + 10)
