"""A reconcile reads only the events after the state it starts from, on a real nats-server: in
memory after the first decision, from the KV bucket in a new process, and from the whole history
when the stored state is unusable; every way, the state and the decision are the ones the whole
history gives."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from events import subjects
from events.schemas import HealthChanged, ProxyDeclared, ProxySpec
from events.store import History, NewEvent
from events.subjects import Aggregate
from services.reconciler.cache import States
from services.reconciler.pure.view import VERSION, ProxyState, fold
from services.reconciler.service import Reconciler
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.snapshots import SnapshotStore
from services.runtime.nats.connection import Connection
from services.runtime.observability.metrics import Metrics

pytestmark = pytest.mark.integration

BUCKET = "test-reconciler-states"
FLAPS = 150


@dataclass
class Counting:
    """The real store, counting the events each read returns."""

    store: JetStreamEventStore
    reads: list[int] = field(default_factory=list)

    async def read(self, aggregate: Aggregate, after_seq: int = 0) -> History:
        history = await self.store.read(aggregate, after_seq)
        self.reads.append(len(history.events))
        return history

    async def append(self, *args: object, **kwargs: object) -> object:
        return await self.store.append(*args, **kwargs)  # type: ignore[arg-type]


async def flapping(store: JetStreamEventStore, uid: str, flaps: int) -> None:
    """A proxy declared long ago whose health has changed ``flaps`` times since."""
    spec = ProxySpec(provider="none-such")
    declared = ProxyDeclared(uid=uid, namespace="crawl", name=uid, spec=spec)
    await store.append(subjects.proxy(uid), [NewEvent(declared, f"{uid}-declared")])
    events = [
        NewEvent(HealthChanged(healthy=n % 2 == 0, reason="Probe"), f"{uid}-flap-{n}")
        for n in range(flaps)
    ]
    for start in range(0, flaps, 50):
        await store.append(subjects.proxy(uid), events[start : start + 50])


def kv(conn: Connection) -> SnapshotStore[ProxyState]:
    return SnapshotStore(conn.js, BUCKET, "state", VERSION, ProxyState)


async def whole(store: JetStreamEventStore, uid: str) -> ProxyState:
    history = await store.read(subjects.proxy(uid))
    return fold(uid, history.events)


async def test_a_second_reconcile_reads_only_what_came_after(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await flapping(jetstream_store, "p1", FLAPS)
    counting = Counting(jetstream_store)
    reconciler = Reconciler(counting, Metrics(), states=States())  # type: ignore[arg-type]
    first = await reconciler.reconcile("p1")
    assert counting.reads[0] == FLAPS + 1
    await flapping(jetstream_store, "p1", 0)  # a re-declaration: stored once, no new event
    await jetstream_store.append(
        subjects.proxy("p1"), [NewEvent(HealthChanged(healthy=True, reason="Probe"), "one-more")]
    )
    counting.reads.clear()
    again = await reconciler.reconcile("p1")
    assert counting.reads[0] <= len(first.events) + 1  # its own appends and the new event
    start, as_of = await reconciler.states.start("p1")
    assert start == await whole(jetstream_store, "p1")
    assert as_of == (await jetstream_store.read(subjects.proxy("p1"))).last_seq
    assert again.outcome in ("noop", first.outcome)


async def test_a_new_process_starts_from_the_stored_state(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await flapping(jetstream_store, "p2", FLAPS)
    await Reconciler(jetstream_store, Metrics(), states=States(kv(conn))).reconcile("p2")
    counting = Counting(jetstream_store)
    fresh = Reconciler(counting, Metrics(), states=States(kv(conn)))  # type: ignore[arg-type]
    await fresh.reconcile("p2")
    assert counting.reads[0] < FLAPS  # not the whole history
    start, _ = await fresh.states.start("p2")
    assert start == await whole(jetstream_store, "p2")


async def test_an_unusable_stored_state_means_the_whole_history(
    conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    await flapping(jetstream_store, "p3", FLAPS)
    await Reconciler(jetstream_store, Metrics(), states=States(kv(conn))).reconcile("p3")
    bucket = await kv(conn).open()
    await bucket.put(f"state.v{VERSION}.view.p3", b"\xc1 garbage")
    other = await kv(conn).get("p3")
    assert other is None
    # A state stored under the wrong key (another proxy's) is not used either.
    stolen = await whole(jetstream_store, "p3")
    await kv(conn).put("p4", stolen, 10**6)
    await flapping(jetstream_store, "p4", 4)
    for uid in ("p3", "p4"):
        counting = Counting(jetstream_store)
        fresh = Reconciler(counting, Metrics(), states=States(kv(conn)))  # type: ignore[arg-type]
        everything = len((await jetstream_store.read(subjects.proxy(uid))).events)
        await fresh.reconcile(uid)
        assert counting.reads[0] == everything
        await fresh.reconcile(uid)  # folds its own appends too
        start, _ = await fresh.states.start(uid)
        assert start == await whole(jetstream_store, uid)
