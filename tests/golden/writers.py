"""Writing a golden log the way the services write theirs: an event store with fixed JetStream
timestamps that keeps each message as bytes, and the writers of each service as the golden
story (``tests/golden/generate.py``) calls them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from commands import declaring
from events import codec, subjects
from events.errors import ConcurrencyError
from events.proxyresource import from_object
from events.schemas import (
    CreateInstance,
    DeleteInstance,
    Event,
    HealthChanged,
    InstanceState,
    LeaseAcquired,
    LeaseReported,
    ObserveInstance,
    RotationRequested,
)
from events.store import AppendResult, History, NewEvent, Recorded, derive_msg_id
from events.subjects import Aggregate, subject_matches
from projections import lease as lease_fold
from projections import proxy as proxy_fold
from services.discovery.pure.policy import LeasePolicy
from services.health.pure.verdict import PROBE_SUCCEEDED
from services.providers.base import Instance
from services.reconciler.pure.decide import decide
from services.reconciler.pure.view import fold as reconciler_fold
from services.reconciler.service import new_events
from tests.golden.logs import Message

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
"""The golden log's first JetStream timestamp; every later one is a fixed step after it."""

POLICY = LeasePolicy()
DRAIN = 30.0
"""The reconciler's drain before a rotated-out instance is deleted (its default)."""


class GoldenLog:
    """An event store (``events.store.EventStore``) that stamps fixed times and keeps the stored
    messages as bytes: the writers that take a store write into it as they would into JetStream."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.now = T0

    def later(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now

    def _last_seq(self, aggregate: Aggregate) -> int:
        found = [m.seq for m in self._of(aggregate)]
        return found[-1] if found else 0

    def _of(self, aggregate: Aggregate) -> list[Message]:
        return [
            m
            for m in self.messages
            if m.stream == aggregate.stream and subject_matches(aggregate.filter_subject, m.subject)
        ]

    async def append(
        self, aggregate: Aggregate, events: Sequence[NewEvent], expected_seq: int | None = None
    ) -> AppendResult:
        if expected_seq is not None and self._last_seq(aggregate) != expected_seq:
            raise ConcurrencyError(str(aggregate), expected_seq)
        return AppendResult(seqs=[self.store(aggregate, new).seq for new in events])

    async def read(self, aggregate: Aggregate, after_seq: int = 0) -> History:
        items = [m.read()[0] for m in self._of(aggregate) if m.seq > after_seq]
        return History(events=items, last_seq=self._last_seq(aggregate))

    def store(self, aggregate: Aggregate, new: NewEvent, after: float = 0.05) -> Recorded:
        """One message, ``after`` seconds after the one before."""
        stream = aggregate.stream
        seq = 1 + sum(1 for m in self.messages if m.stream == stream)
        message = Message(
            stream=stream,
            seq=seq,
            subject=aggregate.subject_for(new.event),
            time=self.later(after),
            headers=codec.envelope_headers(new.event, new.msg_id, new.causation_id),
            payload=codec.encode(new.event),
        )
        self.messages.append(message)
        item, skip = message.read()
        assert skip is None, skip
        return item

    def history(self, aggregate: Aggregate) -> History:
        return asyncio.run(self.read(aggregate))


# ------------------------------------------------------------------------------------ writers


def declare(log: GoldenLog, manifest: dict[str, Any]) -> str:
    """What ``egress-proxies apply`` writes."""
    resource = from_object(manifest)
    log.later(1.0)
    applied = asyncio.run(declaring.apply(log, resource))
    return applied.uid


def reconcile(log: GoldenLog, uid: str, *expected: type[Event], leased: bool = False) -> None:
    """One reconcile, as the reconciler runs it on the newest event; ``expected``: the types it
    must decide (the story below relies on them)."""
    history = log.history(subjects.proxy(uid))
    state = reconciler_fold(uid, history.events)
    decision = decide(state, log.now, leased=leased, drain=DRAIN)
    got = tuple(type(e) for e in decision.events)
    assert got == expected, f"{uid}: decided {got}, the story expects {expected}"
    causation = history.events[-1].msg_id
    made = new_events(uid, decision, history, causation)
    # In the decision's order, as the builds that wrote schema 1 appended them: since D168 the
    # reconciler appends a decision's command after its other events, under the same ids, and
    # every fold reads either order (docs/decisions/0168-executor-facts-chained.md). The golden
    # log keeps what was stored; it is never rewritten.
    for event in decision.events:
        new = next(made_new for made_new in made if made_new.event is event)
        log.store(subjects.proxy(uid), new, after=0.02)


Command = CreateInstance | ObserveInstance | DeleteInstance


def command(log: GoldenLog, uid: str) -> tuple[Command, str]:
    """The newest command and its msg id (the causation of its answers)."""
    for item in reversed(log.history(subjects.proxy(uid)).events):
        if isinstance(item.event, CreateInstance | ObserveInstance | DeleteInstance):
            return item.event, item.msg_id
    raise AssertionError(f"{uid} has no command")


def created(log: GoldenLog, uid: str) -> CreateInstance:
    newest, _ = command(log, uid)
    assert isinstance(newest, CreateInstance), newest
    return newest


def answer(log: GoldenLog, uid: str, event: Event, what: str, after: float) -> None:
    """What the executor appends for the newest command."""
    newest, causation = command(log, uid)
    msg_id = derive_msg_id("executor", uid, newest.command_id, what)
    log.store(subjects.proxy(uid), NewEvent(event, msg_id, causation), after=after)


def local_instance(uid: str, name: str, port: int, since: datetime) -> Instance:
    """A running local proxy, as the local provider reports it."""
    return Instance(
        provider_id=name,
        name=name,
        state=InstanceState.RUNNING,
        owner_uid=uid,
        created_at=since,
        ip="127.0.0.1",
        port=port,
        instance_uid=str(uuid.UUID(derive_msg_id("instance", name))),
    )


def gcp_instance(uid: str, pid: str, since: datetime, state: InstanceState) -> Instance:
    """A Compute Engine VM, as the gcp provider reports it: its address once it runs."""
    running = state is InstanceState.RUNNING
    return Instance(
        provider_id=pid,
        name=pid.rsplit("/", 1)[-1],
        state=state,
        owner_uid=uid,
        created_at=since,
        ip="203.0.113.7" if running else "",
        instance_uid="5093324768521145863",
    )


def verdict(log: GoldenLog, uid: str, latency_ms: float) -> None:
    """The health prober's first verdict on the instance it probes (``probe_target``)."""
    view = proxy_fold.fold(log.history(subjects.proxy(uid)).events)
    assert view is not None
    target, _ = proxy_fold.probe_target(view)
    event = HealthChanged(
        healthy=True,
        reason=PROBE_SUCCEEDED,
        message="first verdict: 1 consecutive probe(s) succeeded",
        latency_ms=latency_ms,
        provider_id=target,
    )
    msg_id = derive_msg_id("health", uid, target, str(view.last_seq), "True", PROBE_SUCCEEDED)
    log.store(subjects.proxy(uid), NewEvent(event, msg_id), after=1.5)


def lease_view(log: GoldenLog, uid: str) -> lease_fold.LeaseView | None:
    return lease_fold.fold(log.history(subjects.lease(uid)).events)


def lease_event(log: GoldenLog, uid: str, event: Event, msg_id: str, after: float) -> None:
    log.store(subjects.lease(uid), NewEvent(event, msg_id), after=after)


def acquire(log: GoldenLog, uid: str, lease_id: str, holder: str, ttl: float) -> None:
    """A claim as discovery makes it (``services.discovery.leasing.leases``)."""
    view = lease_view(log, uid)
    server_now = log.later(0.5)
    event = LeaseAcquired(
        lease_id=lease_id,
        proxy_uid=uid,
        holder=holder,
        ttl_seconds=ttl,
        requested_ttl_seconds=ttl,
        selector={"country": "de"},
        fencing_token=(view.fencing_token if view else 0) + 1,
        cooldown_seconds=POLICY.cooldown,
        deadline=POLICY.deadline(server_now),
        target="shop.example.com",
    )
    lease_event(log, uid, event, derive_msg_id("lease-acquired", lease_id), after=0.01)


def report(log: GoldenLog, uid: str, lease_id: str, outcome: str, n: int) -> None:
    event = LeaseReported(
        lease_id=lease_id,
        proxy_uid=uid,
        outcome=outcome,
        target="shop.example.com",
        detail="HTTP 403 from shop.example.com" if outcome == "blocked" else "",
        deadline=POLICY.deadline(log.later(2.0)),
        backoff_seconds=POLICY.block_backoff if outcome == "blocked" else 0.0,
    )
    lease_event(log, uid, event, derive_msg_id("lease-reported", lease_id, str(n)), after=0.01)


def request_rotation(log: GoldenLog, uid: str, lease_id: str) -> str:
    """``POST /v1/leases/{id}/rotate`` (``services.discovery.leasing.rotation``)."""
    history = log.history(subjects.proxy(uid))
    rotation_id = "rot-" + derive_msg_id("rotation", uid, lease_id, str(history.last_seq))[:20]
    event = RotationRequested(uid=uid, rotation_id=rotation_id, lease_id=lease_id)
    msg_id = derive_msg_id("rotation-requested", rotation_id)
    log.store(subjects.proxy(uid), NewEvent(event, msg_id), after=1.0)
    return rotation_id
