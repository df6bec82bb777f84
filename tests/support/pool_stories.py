"""Pool stories over the pool fold and the pool controller's pure decide (docs/architecture.md,
"Pools"): a pool's events appended one by one, each decision appended as the controller appends
it, and its members' states set as the reconciler, the health service and discovery would leave
them. No servers, no clock but the story's. Shared by the fold's and the decider's tests."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import msgspec

from events.pool import (
    PoolDeclared,
    PoolDeletionRequested,
    PoolScaled,
    PoolSpec,
    PoolSpecChanged,
    SpreadEntry,
)
from events.poolresource import pool_uid
from events.schemas import Event, ProxySpec
from events.store import Recorded
from projections.pool import Planned, PoolView, apply
from projections.pool_demand import Demand
from projections.pool_members import MemberState
from services.pools.pure.decide import Decision, decide
from services.pools.pure.members import member_spec
from services.pools.pure.record import recorded_as

NAMESPACE = "ns"
NAME = "de"
UID = pool_uid(NAMESPACE, NAME)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def pool_spec(
    replicas: int = 0,
    *,
    spread: Iterable[tuple[str, int]] = (),
    provider: str = "local",
    max_age: float = 0.0,
    blocks: int = 0,
    surge: int = 1,
    attributes: dict[str, str] | None = None,
) -> PoolSpec:
    """A pool spec as ``from_object`` would give it; with a spread, the template names none."""
    entries = tuple(SpreadEntry(provider=p, weight=w) for p, w in spread)
    template = ProxySpec(
        provider="" if entries else provider, attributes=attributes or {"country": "de"}
    )
    return PoolSpec(
        replicas=replicas,
        template=template,
        spread=entries,
        max_age_seconds=max_age,
        recycle_on_blocks=blocks,
        max_surge=surge,
    )


class PoolStory:
    """A pool's log with the story's clock, and what the shared views say of its members."""

    def __init__(self, spec: PoolSpec | None = None) -> None:
        self.events: list[Recorded] = []
        self._view: PoolView | None = None
        self.now = T0
        self.states: dict[str, MemberState] = {}
        self.demand = Demand()
        """What discovery could not serve, as the controller reads it (autoscale)."""
        self.spec = spec or pool_spec()
        self.generation = 1
        if spec is not None:
            self.add(PoolDeclared(uid=UID, namespace=NAMESPACE, name=NAME, spec=spec))

    def add(self, *events: Event) -> PoolStory:
        for event in events:
            seq = len(self.events) + 1
            subject = f"pool.{UID}.{event.category}"
            recorded = Recorded(event, seq, subject, self.now)  # type: ignore[arg-type]
            self.events.append(recorded)
            if self._view is not None or isinstance(event, PoolDeclared):
                # Folded as it grows (``projections.pool.fold`` skips what comes before the
                # declaration alike), so a story of 10,000 members stays quick.
                self._view = apply(self._view, recorded)
        return self

    def wait(self, seconds: float) -> PoolStory:
        self.now += timedelta(seconds=seconds)
        return self

    @property
    def view(self) -> PoolView:
        assert self._view is not None, "no PoolDeclared yet"
        return self._view

    def decide(self) -> Decision | None:
        return decide(self.view, self.states, self.now, self.demand)

    def step(self) -> Decision | None:
        """Decide and append the decision, as one evaluation of the controller records it."""
        view = self.view
        decision = decide(view, self.states, self.now, self.demand)
        if decision is not None:
            self.add(recorded_as(decision, view))
        return decision

    def scale(self, replicas: int) -> PoolStory:
        return self.add(PoolScaled(uid=UID, replicas=replicas))

    def change(self, spec: PoolSpec) -> PoolStory:
        self.generation += 1
        self.spec = spec
        return self.add(PoolSpecChanged(uid=UID, spec=spec, generation=self.generation))

    def delete(self) -> PoolStory:
        return self.add(PoolDeletionRequested(uid=UID))

    # ------------------------------------------------------------------ the members' states

    def planned(self, uid: str) -> Planned:
        return self.view.members[uid]

    def active(self) -> list[str]:
        return [p.member.uid for p in self.view.active()]

    def run(self, *uids: str) -> PoolStory:
        """Every planned member without a Proxy (or those named) declared with the spec the
        controller gives it and Ready and healthy from now, as the reconciler leaves it."""
        view = self.view
        for planned in view.active():
            uid = planned.member.uid
            if (uids and uid not in uids) or (not uids and self.states.get(uid) is not None):
                continue
            self.states[uid] = MemberState(
                uid=uid,
                declared=True,
                phase="Ready",
                ready=True,
                healthy=True,
                since=self.now,
                spec=member_spec(view.name, view.spec, planned.member),
            )
        return self

    def set(self, uid: str, **fields: object) -> PoolStory:
        self.states[uid] = msgspec.structs.replace(
            self.states.get(uid, MemberState(uid=uid)), **fields
        )
        return self

    def failed(self, uid: str) -> PoolStory:
        return self.set(uid, phase="Failed", ready=False, healthy=False, failed=True)

    def gone(self) -> PoolStory:
        """Every retired member's Proxy removed, as the controller's deletes end."""
        for planned in self.view.retired():
            self.states.pop(planned.member.uid, None)
        return self

    def provider_of(self, uid: str) -> str:
        return self.planned(uid).member.provider

    def counts(self) -> dict[str, int]:
        """Active members per provider."""
        found: dict[str, int] = {}
        for planned in self.view.active():
            found[planned.member.provider] = found.get(planned.member.provider, 0) + 1
        return found


def running(spec: PoolSpec) -> PoolStory:
    """A pool at its replicas, every member Ready and healthy."""
    story = PoolStory(spec)
    while (decision := story.step()) is not None:
        assert decision.reason == "ScaleUp", decision
    story.run()
    assert story.decide() is None
    return story


def staggered(replicas: int) -> PoolStory:
    """A pool whose members became Ready a minute apart, by ordinal."""
    story = PoolStory(pool_spec(replicas))
    story.step()
    for uid in story.active():
        story.run(uid).wait(60)
    return story
