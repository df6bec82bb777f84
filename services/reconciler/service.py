"""The reconciler service: every declared, instance or health event re-decides its proxy.

The handler reads the aggregate, folds it, decides and appends with optimistic concurrency
(``events.store.decide_and_append``, the loop every writer shares); a conflict means another
replica (or the executor) appended first, so it folds again. What it keeps between messages is
only where to start folding (``cache``): every decision still reads what the log holds after it,
which is what lets any number of replicas share the consumer. When to come back to a proxy no
event will wake is the pure decider's (``decide.revisit``).

Make-before-break rotations (docs/decisions/0085-a-fresh-ip-without-downtime.md) add the proxy's
lease subject to two decisions (``leases``): whether a spec change may break first (only when nobody
holds a lease), and, after a promotion, the switch of the lease to the new instance, made good on
every reconcile until the old instance is gone; the old instance's delete waits for the drain as a
delayed redelivery.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import msgspec
import structlog
from opentelemetry import trace
from opentelemetry.trace import Span

from events import codec, subjects
from events.schemas import CreateInstance, ReplacementPromoted
from events.store import EventStore, History, NewEvent, decide_and_append, derive_msg_id
from services.reconciler.cache import STATES_BUCKET, States
from services.reconciler.leases import is_leased, switch_lease
from services.reconciler.pure.decide import decide, revisit, wakes
from services.reconciler.pure.decide_rotate import needs_lease
from services.reconciler.pure.decision import NOTHING, Decision
from services.reconciler.pure.view import VERSION as STATE_VERSION
from services.reconciler.pure.view import ProxyState, fold
from services.runtime.eventlog.snapshots import SnapshotStore
from services.runtime.nats.consumer import ConsumerLoop, ConsumerSpec, Delivery, Outcome, Retry
from services.runtime.observability import spans
from services.runtime.observability.metrics import Metrics
from services.runtime.service import ServiceContext
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import setting

log = structlog.get_logger("egress.reconciler")
_tracer = trace.get_tracer("egress_proxies.reconciler")

FILTERS = ("proxy.*.*",)
"""Every event of the stream: the stream's own subject, which the server delivers from at the
same cost per message at any fleet size. A durable filtered by several subjects cost it a walk
over every subject of a message block per delivery (docs/benchmarks.md, "Proxy lifecycle").
The categories that cannot change a decision are acknowledged unread (``decide.wakes``); the
reconciler's own decisions among them keep its states current (``States.chain``)."""
EARLIER_FILTERS = (("proxy.*.declared", "proxy.*.instance", "proxy.*.health", "proxy.*.rotate"),)
"""The durable's filters in earlier versions: a durable found so is updated in place."""
MAX_ATTEMPTS = 50
COMMANDS = CreateInstance.category
"""The category of the commands the executor answers."""


class ReconcilerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What ``run reconciler`` takes (docs/decisions/0148-one-settings-struct-per-service.md)."""

    reconcile_concurrency: Annotated[
        int, setting("Proxies one reconciler replica decides at once.", ge=1, le=4096)
    ] = 64
    replace_unhealthy_after: Annotated[
        float,
        setting(
            "Seconds an instance may fail its health probes before it is replaced; 0 never "
            "replaces for health.",
            ge=0,
        ),
    ] = 0.0
    rotation_drain: Annotated[
        float,
        setting(
            "Seconds an instance replaced make-before-break (a lease rotation, a leased "
            "proxy's spec change) keeps serving after its lease switched, so that requests "
            "already sent through it finish; then it is deleted.",
            ge=0,
            le=3600,
        ),
    ] = 5.0
    """docs/decisions/0085-a-fresh-ip-without-downtime.md"""


DEFAULTS = ReconcilerSettings()
DEFAULT_DRAIN = DEFAULTS.rotation_drain
ROUTINE = frozenset({"create", "ready"})
"""Outcomes every proxy's life goes through, logged at debug: their events are in the log and
``egress_reconcile_total`` counts them, and a line each cost the reconciler about a seventh of
its CPU per proxy (docs/decisions/0168-executor-facts-chained.md). The others (a replace, a
failure, a delete, a rotation) stay at info."""
_SPAN_BY_OUTCOME = {
    "replace": "reconcile.replaceInstance",
    "delete": "reconcile.delete",
    "removed": "reconcile.delete",
    "rotate": "reconcile.rotate",
    "promote": "reconcile.rotate",
    "retire": "reconcile.rotate",
}


def new_events(uid: str, decision: Decision, history: History, causation: str) -> list[NewEvent]:
    """Ids derive from the uid, the folded sequence and the position in the decision: the same
    state decided twice (two replicas, a redelivery) yields the same ids, stored once.

    A command is appended after the decision's other events (its status), so that when the
    executor takes it, it is most likely the proxy's last event: the executor's answer can then
    be appended expecting the command's own sequence, and the reconciler folds that answer on
    from its kept state without a read (docs/decisions/0168-executor-facts-chained.md). The ids
    stay those of the decision's order, so a replica of the earlier order that decided the same
    state writes the same events under the same ids."""
    made = [
        NewEvent(
            event,
            derive_msg_id("reconcile", uid, str(history.last_seq), str(i)),
            causation,
        )
        for i, event in enumerate(decision.events)
    ]
    return sorted(made, key=_is_command)


def _is_command(new: NewEvent) -> bool:
    return type(new.event).category == COMMANDS


class Reconciler:
    def __init__(
        self,
        store: EventStore,
        metrics: Metrics,
        *,
        replace_unhealthy_after: float = DEFAULTS.replace_unhealthy_after,
        states: States | None = None,
        rotation_drain: float = DEFAULT_DRAIN,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.replace_unhealthy_after = replace_unhealthy_after
        self.states = states or States()
        self.rotation_drain = rotation_drain
        self._skipped = metrics.reconcile.labels("skipped")

    async def reconcile(self, uid: str, causation: str = "") -> Decision:
        """Decide and append; returns the decision that was appended (or found unneeded)."""
        decision, _ = await self._reconcile(uid, causation)
        return decision

    async def _reconcile(
        self, uid: str, causation: str, exact: int | None = None
    ) -> tuple[Decision, ProxyState]:
        """Fold → decide → append, re-folding on every conflict, from the state ``states``
        kept: only the events after it are read. ``exact``: the sequence the kept state is
        known complete as of (it folded the delivered event itself): the first attempt decides
        from it without a read, and its append expects that sequence."""
        aggregate = subjects.proxy(uid)
        with (
            spans.current(_tracer, "Reconcile Proxy", attributes=lambda: {"proxy.uid": uid}),
            spans.current(_tracer, "reconcile.managed") as span,
        ):
            attempts = _Attempts(self, uid, causation, span)
            await decide_and_append(
                self.store,
                aggregate,
                attempts.decide,
                max_attempts=MAX_ATTEMPTS,
                after=attempts.start,
                known=attempts.known(exact),
            )
            decision, state = attempts.decision, attempts.state
            promoted = decision.events[0] if decision.events else None
            if isinstance(promoted, ReplacementPromoted):
                await switch_lease(
                    self.store, uid, promoted.rotation_id, promoted.provider_id, promoted.ip
                )
        self.metrics.reconcile.labels(decision.outcome).inc()
        if decision.outcome != "noop":
            said = log.debug if decision.outcome in ROUTINE else log.info
            said(
                "reconciled",
                proxy_uid=uid,
                outcome=decision.outcome,
                events=[type(e).__name__ for e in decision.events],
                conflicts=attempts.made - 1,
            )
        return decision, state

    def settle(self, delivery: Delivery) -> bool:
        """An event that cannot change a decision (``decide.wakes``) is settled by the consumer
        loop inline, without a task: it only moves the kept state forward when it provably
        follows it (``States.chain``), and nothing is appended, so there is nothing to wait
        for before its acknowledgement (docs/decisions/0165-deliveries-settled-inline.md).
        Declines the others, untouched."""
        if wakes(delivery.recorded.event):
            return False
        self._chain(delivery)
        self._skipped.inc()
        return True

    def _chain(self, delivery: Delivery) -> tuple[str, bool]:
        recorded = delivery.recorded
        uid = subjects.proxy_uid_of(recorded.subject)
        after = codec.expected_last(delivery.msg.headers, subjects.proxy(uid).filter_subject)
        return uid, self.states.chain(uid, recorded, after)

    async def handle(self, delivery: Delivery) -> Outcome:
        recorded = delivery.recorded
        uid, chained = self._chain(delivery)
        if not wakes(recorded.event):
            self._skipped.inc()
            return None
        exact = recorded.seq if chained else None
        decision, state = await self._reconcile(uid, recorded.msg_id, exact)
        later = revisit(
            state,
            decision,
            datetime.now(UTC),
            self.replace_unhealthy_after,
            drain=self.rotation_drain,
        )
        # A delayed redelivery, so the wait survives a crash.
        return None if later is None else Retry(later.delay, later.reason)


class _Attempts:
    """One reconcile's attempts, as ``decide_and_append`` makes them: each starts folding from
    the state ``states`` kept, and the last one's decision and state are the reconcile's."""

    def __init__(self, reconciler: Reconciler, uid: str, causation: str, span: Span) -> None:
        self.reconciler = reconciler
        self.uid = uid
        self.causation = causation
        self.span = span
        self.made = 0
        self.decision = NOTHING
        self.state = ProxyState(uid=uid)
        self._start = self.state

    async def start(self) -> int:
        """The sequence the kept state is complete as of: the attempt reads the events after."""
        self._start, as_of = await self.reconciler.states.start(self.uid)
        return as_of

    def known(self, exact: int | None) -> History | None:
        """The first attempt's history when the kept state is complete as of exactly ``exact``
        (it folded the delivered event): nothing after it to read; else None (read)."""
        kept = None if exact is None else self.reconciler.states.exactly(self.uid, exact)
        if kept is None or exact is None:
            return None
        self._start = kept
        return History([], exact)

    async def decide(self, history: History) -> list[NewEvent]:
        r, uid = self.reconciler, self.uid
        self.made += 1
        state = fold(uid, history.events, self._start)
        await r.states.keep(uid, state, history.last_seq, len(history.events))
        if state.retiring_id and state.promoted_rotation:
            # Level-triggered: a crash after the promotion and before the lease's switch is
            # made good here, always before the old instance is deleted.
            await switch_lease(r.store, uid, state.promoted_rotation, state.instance_id, state.ip)
        leased = needs_lease(state) and await is_leased(r.store, uid)
        self.state = state
        self.decision = decide(
            state,
            datetime.now(UTC),
            r.replace_unhealthy_after,
            leased=leased,
            drain=r.rotation_drain,
        )
        # Named once the decision is known: the appends that follow are its children.
        self.span.update_name(_SPAN_BY_OUTCOME.get(self.decision.outcome, "reconcile.managed"))
        self.span.set_attribute("reconcile.outcome", self.decision.outcome)
        return new_events(uid, self.decision, history, self.causation)


@dataclass
class ReconcilerService:
    name: str = "reconciler"
    concurrency: int = DEFAULTS.reconcile_concurrency
    replace_unhealthy_after: float = DEFAULTS.replace_unhealthy_after
    rotation_drain: float = DEFAULTS.rotation_drain

    async def run(self, ctx: ServiceContext) -> None:
        store = SnapshotStore(ctx.conn.js, STATES_BUCKET, "state", STATE_VERSION, ProxyState)
        states = States(store)
        reconciler = Reconciler(
            ctx.store,
            ctx.metrics,
            replace_unhealthy_after=self.replace_unhealthy_after,
            states=states,
            rotation_drain=self.rotation_drain,
        )
        spec = ConsumerSpec(
            stream=subjects.PROXY_STREAM,
            durable="reconciler",
            filter_subjects=FILTERS,
            earlier_filters=EARLIER_FILTERS,
            concurrency=self.concurrency,
            batch=min(self.concurrency, 256),
            # Waiting to replace an unhealthy instance is a delayed redelivery, which counts.
            max_deliver=100,
        )
        loop = ConsumerLoop(
            ctx.conn,
            spec,
            reconciler.handle,
            store=ctx.store,
            metrics=ctx.metrics,
            settle=reconciler.settle,
        )
        await loop.run()


def build(settings: Settings, config: ReconcilerSettings) -> ReconcilerService:
    """The factory ``run reconciler`` and ``up`` call."""
    del settings  # the reconciler needs nothing beyond the ServiceContext
    return ReconcilerService(
        concurrency=config.reconcile_concurrency,
        replace_unhealthy_after=config.replace_unhealthy_after,
        rotation_drain=config.rotation_drain,
    )
