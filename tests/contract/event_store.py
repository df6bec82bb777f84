"""The event-store contract: every implementation must pass this same suite.

Subclasses provide two fixtures: ``store`` and ``raw_append`` (to store bytes the codec would
never write: a type from a newer version, a broken payload).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import pytest

from events import subjects
from events.codec import InvalidEvent
from events.errors import ConcurrencyError
from events.schemas import (
    CreateInstance,
    HealthChanged,
    InstanceCreated,
    LeaseAcquired,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
)
from events.store import EventStore, History, NewEvent, decide_and_append

RawAppend = Callable[[str, str, bytes, dict[str, str]], Awaitable[int]]


def declared(uid: str) -> NewEvent:
    event = ProxyDeclared(
        uid=uid, namespace="default", name=f"p-{uid}", spec=ProxySpec(provider="local")
    )
    return NewEvent(event, msg_id=f"{uid}-declared")


def health(n: int) -> NewEvent:
    return NewEvent(HealthChanged(healthy=n % 2 == 0, reason=f"r{n}"), msg_id=f"health-{n}")


def command(n: int) -> NewEvent:
    spec = ProxySpec(provider="local")
    event = CreateInstance(command_id=f"c{n}", provider="local", instance_name=f"i{n}", spec=spec)
    return NewEvent(event, msg_id=f"cmd-{n}")


def instance(n: int) -> NewEvent:
    event = InstanceCreated(command_id=f"c{n}", provider="local", provider_id=f"i{n}")
    return NewEvent(event, msg_id=f"instance-{n}")


def status(n: int) -> NewEvent:
    return NewEvent(PhaseChanged(phase=Phase.PENDING, reason=f"s{n}"), msg_id=f"status-{n}")


def category(subject: str) -> str:
    return subject.rsplit(".", 1)[-1]


class EventStoreContract:
    async def test_empty_aggregate_reads_as_sequence_zero(self, store: EventStore) -> None:
        history = await store.read(subjects.proxy("nobody"))
        assert history.events == []
        assert history.last_seq == 0

    async def test_append_then_read_in_order_with_metadata(self, store: EventStore) -> None:
        agg = subjects.proxy("u1")
        result = await store.append(agg, [declared("u1"), health(1), health(2)], expected_seq=0)
        assert len(result.seqs) == 3
        assert result.seqs == sorted(result.seqs)
        assert result.duplicates == 0
        history = await store.read(agg)
        assert [r.seq for r in history.events] == result.seqs
        assert history.last_seq == result.seqs[-1]
        assert isinstance(history.events[0].event, ProxyDeclared)
        assert history.events[0].subject == "proxy.u1.declared"
        assert history.events[1].subject == "proxy.u1.health"
        assert history.events[1].msg_id == "health-1"
        assert history.events[0].timestamp <= history.events[2].timestamp
        assert history.events[0].timestamp.tzinfo is not None

    async def test_stale_expectation_is_a_conflict(self, store: EventStore) -> None:
        agg = subjects.proxy("u2")
        first = await store.append(agg, [declared("u2")], expected_seq=0)
        await store.append(agg, [health(1)], expected_seq=first.last_seq)
        with pytest.raises(ConcurrencyError):
            await store.append(agg, [health(2)], expected_seq=first.last_seq)
        with pytest.raises(ConcurrencyError):
            await store.append(agg, [health(3)], expected_seq=0)
        assert len((await store.read(agg)).events) == 2

    async def test_conflicts_are_per_aggregate(self, store: EventStore) -> None:
        a, b = subjects.proxy("a1"), subjects.proxy("b1")
        await store.append(a, [declared("a1")], expected_seq=0)
        await store.append(b, [declared("b1")], expected_seq=0)
        await store.append(a, [health(1)], expected_seq=(await store.read(a)).last_seq)
        assert [r.subject for r in (await store.read(b)).events] == ["proxy.b1.declared"]

    async def test_duplicate_msg_id_is_stored_once(self, store: EventStore) -> None:
        agg = subjects.proxy("u3")
        first = await store.append(agg, [declared("u3")])
        again = await store.append(agg, [declared("u3")])
        assert again.seqs == first.seqs
        assert again.duplicates == 1
        assert len((await store.read(agg)).events) == 1

    async def test_retry_after_lost_ack_is_not_a_conflict(self, store: EventStore) -> None:
        """The writer appended, lost the acknowledgement and retries with the same expectation."""
        agg = subjects.proxy("u4")
        first = await store.append(agg, [declared("u4"), health(1)], expected_seq=0)
        again = await store.append(agg, [declared("u4"), health(1)], expected_seq=0)
        assert again.seqs == first.seqs
        assert again.duplicates == 2
        assert len((await store.read(agg)).events) == 2

    async def test_partial_earlier_append_is_completed(self, store: EventStore) -> None:
        agg = subjects.proxy("u5")
        first = await store.append(agg, [declared("u5")], expected_seq=0)
        done = await store.append(agg, [declared("u5"), health(1)], expected_seq=0)
        assert done.seqs[0] == first.seqs[0]
        assert done.duplicates == 1
        assert [r.msg_id for r in (await store.read(agg)).events] == ["u5-declared", "health-1"]

    @pytest.mark.parametrize("expected", [0, None], ids=["checked", "unchecked"])
    async def test_an_event_that_cannot_be_encoded_stores_none_of_its_append(
        self, store: EventStore, expected: int | None
    ) -> None:
        """Found before anything is sent: the append fails whole, and its retry (the event
        fixed) is not taken for an earlier attempt."""
        agg = subjects.proxy("whole")
        broken = NewEvent(HealthChanged(healthy=True, reason="\ud800"), msg_id="broken")
        with pytest.raises(InvalidEvent):
            await store.append(agg, [declared("whole"), broken, health(1)], expected_seq=expected)
        assert (await store.read(agg)).last_seq == 0
        done = await store.append(agg, [declared("whole"), health(1)], expected_seq=expected)
        assert done.duplicates == 0
        assert [r.msg_id for r in (await store.read(agg)).events] == ["whole-declared", "health-1"]

    async def test_a_conflicting_append_of_several_stores_none(self, store: EventStore) -> None:
        agg = subjects.proxy("lost-race")
        first = await store.append(agg, [declared("lost-race")], expected_seq=0)
        with pytest.raises(ConcurrencyError):
            await store.append(agg, [command(1), status(1)], expected_seq=0)
        history = await store.read(agg)
        assert [r.msg_id for r in history.events] == ["lost-race-declared"]
        assert history.last_seq == first.last_seq

    async def test_a_retried_append_after_part_of_it_was_stored_by_another_writer(
        self, store: EventStore
    ) -> None:
        """Unchecked appends of several events whose first is already stored: the rest is
        stored once, the first is not stored again."""
        agg = subjects.proxy("partly")
        first = await store.append(agg, [health(1)])
        done = await store.append(agg, [health(1), health(2), health(3)])
        assert done.seqs[0] == first.seqs[0]
        assert done.duplicates == 1
        assert [r.msg_id for r in (await store.read(agg)).events] == [
            "health-1",
            "health-2",
            "health-3",
        ]

    async def test_read_after_sequence(self, store: EventStore) -> None:
        agg = subjects.proxy("u6")
        result = await store.append(agg, [declared("u6"), health(1), health(2)], expected_seq=0)
        tail = await store.read(agg, after_seq=result.seqs[0])
        assert [r.seq for r in tail.events] == result.seqs[1:]
        assert tail.last_seq == result.seqs[-1]
        nothing = await store.read(agg, after_seq=result.seqs[-1])
        assert nothing.events == []
        assert nothing.last_seq == result.seqs[-1]

    async def test_categories_interleave_in_sequence_order(self, store: EventStore) -> None:
        """A proxy's events live on one subject per category; a read returns them in the order
        they were appended, whatever the category, with other aggregates' events in between."""
        agg, other = subjects.proxy("mixed"), subjects.proxy("other")
        appended = [
            declared("mixed"),
            command(1),
            instance(1),
            health(1),
            status(1),
            health(2),
            command(2),
            status(2),
        ]
        seqs: list[int] = []
        last = other_last = 0
        for n, new in enumerate(appended):
            last = (await store.append(agg, [new], expected_seq=last)).last_seq
            seqs.append(last)
            other_new = [health(100 + n)]
            other_last = (await store.append(other, other_new, expected_seq=other_last)).last_seq
        history = await store.read(agg)
        assert [r.seq for r in history.events] == seqs
        assert [r.msg_id for r in history.events] == [new.msg_id for new in appended]
        assert [category(r.subject) for r in history.events] == [
            "declared",
            "cmd",
            "instance",
            "health",
            "status",
            "health",
            "cmd",
            "status",
        ]
        assert history.last_seq == seqs[-1]
        assert [r.msg_id for r in (await store.read(other)).events] == [
            f"health-{100 + n}" for n in range(len(appended))
        ]

    async def test_read_after_a_sequence_in_the_middle_spans_categories(
        self, store: EventStore
    ) -> None:
        agg = subjects.proxy("middle")
        appended = [declared("middle"), command(1), health(1), status(1), instance(1), health(2)]
        seqs = (await store.append(agg, appended, expected_seq=0)).seqs
        tail = await store.read(agg, after_seq=seqs[1])
        assert [r.seq for r in tail.events] == seqs[2:]
        assert [category(r.subject) for r in tail.events] == [
            "health",
            "status",
            "instance",
            "health",
        ]
        assert tail.last_seq == seqs[-1]
        last = await store.read(agg, after_seq=seqs[-2])
        assert [r.msg_id for r in last.events] == ["health-2"]
        assert last.last_seq == seqs[-1]
        # The categories with nothing after the sequence add nothing.
        assert (await store.read(agg, after_seq=seqs[3])).events[0].msg_id == "instance-1"

    async def test_skipped_events_on_any_subject_keep_the_last_sequence(
        self, store: EventStore, raw_append: RawAppend
    ) -> None:
        """Poison in the middle of one category and, newest, an event on a category this version
        does not know: both are left out, and ``last_seq`` is still the aggregate's last."""
        agg = subjects.proxy("odd")
        first = await store.append(agg, [declared("odd"), health(1)], expected_seq=0)
        poison = await raw_append(
            "PROXY", "proxy.odd.cmd", b"{not json", {"Egress-Event-Type": "CreateInstance"}
        )
        later = await store.append(agg, [status(1)], expected_seq=poison)
        future = await raw_append(
            "PROXY",
            "proxy.odd.future",
            b'{"type":"FromTheFuture"}',
            {"Egress-Event-Type": "FromTheFuture", "Nats-Msg-Id": "future-odd"},
        )
        history = await store.read(agg)
        assert [r.seq for r in history.events] == [*first.seqs, *later.seqs]
        assert history.skipped == 2
        assert history.last_seq == future
        tail = await store.read(agg, after_seq=later.last_seq)
        assert (tail.events, tail.skipped, tail.last_seq) == ([], 1, future)
        result = await decide_and_append(store, agg, lambda h: [health(2)])
        assert result.seqs == [future + 1]

    async def test_long_history_across_categories_reads_whole_in_order(
        self, store: EventStore
    ) -> None:
        agg = subjects.proxy("long-mixed")
        batch = [status(i) if i % 3 == 0 else health(i) for i in range(1600)]
        await store.append(agg, batch)
        history = await store.read(agg)
        assert [r.msg_id for r in history.events] == [n.msg_id for n in batch]
        seqs = [r.seq for r in history.events]
        assert seqs == sorted(seqs)
        assert history.last_seq == seqs[-1]

    async def test_long_history_reads_whole(self, store: EventStore) -> None:
        agg = subjects.proxy("long")
        batch = [health(i) for i in range(2500)]
        await store.append(agg, batch)
        history = await store.read(agg)
        assert [r.msg_id for r in history.events] == [n.msg_id for n in batch]

    async def test_lease_aggregate_is_one_subject(self, store: EventStore) -> None:
        agg = subjects.lease("p1")
        event = LeaseAcquired(lease_id="l1", proxy_uid="p1", ttl_seconds=30)
        await store.append(agg, [NewEvent(event, msg_id="l1-acquired")], expected_seq=0)
        history = await store.read(agg)
        assert history.events[0].subject == "lease.p1"
        with pytest.raises(ConcurrencyError):
            await store.append(agg, [NewEvent(event, msg_id="l2-acquired")], expected_seq=0)

    async def test_racing_deciders_both_land_after_refold(self, store: EventStore) -> None:
        """Two writers fold the same state; the loser re-folds and decides on the new state."""
        agg = subjects.proxy("race")
        await store.append(agg, [declared("race")], expected_seq=0)
        calls: list[int] = []
        gate = asyncio.Barrier(2)

        def decider(name: str) -> Callable[[History], Sequence[NewEvent]]:
            def decide(history: History) -> Sequence[NewEvent]:
                calls.append(len(history.events))
                phases = [r.event for r in history.events if isinstance(r.event, PhaseChanged)]
                if any(p.reason == name for p in phases):
                    return []
                return [NewEvent(PhaseChanged(phase=Phase.PENDING, reason=name), msg_id=name)]

            return decide

        class SlowRead:
            """Both writers read before either appends, forcing one conflict."""

            def __init__(self, inner: EventStore) -> None:
                self.inner = inner
                self.first = True

            async def read(self, aggregate: subjects.Aggregate, after_seq: int = 0) -> History:
                history = await self.inner.read(aggregate, after_seq)
                if self.first:
                    await gate.wait()
                    self.first = False
                return history

            async def append(self, *args: object, **kwargs: object) -> object:
                return await self.inner.append(*args, **kwargs)  # type: ignore[arg-type]

        a, b = SlowRead(store), SlowRead(store)
        await asyncio.gather(
            decide_and_append(a, agg, decider("alpha")),  # type: ignore[arg-type]
            decide_and_append(b, agg, decider("beta")),  # type: ignore[arg-type]
        )
        reasons = [
            r.event.reason
            for r in (await store.read(agg)).events
            if isinstance(r.event, PhaseChanged)
        ]
        assert sorted(reasons) == ["alpha", "beta"]
        assert len(calls) == 3  # the loser decided twice

    async def test_decide_nothing_appends_nothing(self, store: EventStore) -> None:
        agg = subjects.proxy("quiet")
        result = await decide_and_append(store, agg, lambda history: [])
        assert result.seqs == []
        assert (await store.read(agg)).last_seq == 0

    async def test_unknown_event_type_is_skipped(
        self, store: EventStore, raw_append: RawAppend
    ) -> None:
        agg = subjects.proxy("future")
        await store.append(agg, [declared("future")], expected_seq=0)
        seq = await raw_append(
            "PROXY",
            "proxy.future.status",
            b'{"type":"FromTheFuture","x":1}',
            {"Egress-Event-Type": "FromTheFuture", "Nats-Msg-Id": "future-1"},
        )
        history = await store.read(agg)
        assert [type(r.event).__name__ for r in history.events] == ["ProxyDeclared"]
        assert history.skipped == 1
        assert history.last_seq == seq

    @pytest.mark.parametrize(
        ("payload", "headers"),
        [
            (b"{not json", {"Egress-Event-Type": "PhaseChanged"}),
            (b'{"type":"PhaseChanged","phase":"Bogus"}', {}),
            (b'{"type":"HealthChanged","healthy":"yes"}', {"Egress-Event-Type": "HealthChanged"}),
            (b"", {}),
            (b"\xff\xfe\x00binary", {"Egress-Event-Type": "ProxyDeclared"}),
        ],
        ids=["not-json", "bad-enum", "wrong-type", "empty", "binary"],
    )
    async def test_poison_is_skipped_and_the_aggregate_stays_writable(
        self, store: EventStore, raw_append: RawAppend, payload: bytes, headers: dict[str, str]
    ) -> None:
        agg = subjects.proxy("poisoned")
        await store.append(agg, [declared("poisoned")], expected_seq=0)
        seq = await raw_append("PROXY", "proxy.poisoned.status", payload, headers)
        history = await store.read(agg)
        assert [type(r.event).__name__ for r in history.events] == ["ProxyDeclared"]
        assert history.skipped == 1
        assert history.last_seq == seq
        # Decide-and-append decides on what decoded and expects the real last sequence.
        result = await decide_and_append(
            store, agg, lambda h: [health(h.last_seq)] if h.skipped else []
        )
        assert result.seqs == [seq + 1]
        assert (await store.read(agg)).last_seq == seq + 1
