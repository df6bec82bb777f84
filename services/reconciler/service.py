"""The reconciler service: every declared, instance or health event re-decides its proxy.

The handler reads the aggregate, folds it, decides and appends with optimistic concurrency; a
conflict means another replica (or the executor) appended first, so it folds again. What it keeps
between messages is only where to start folding (``states``): every decision still reads what the
log holds after it, which is what lets any number of replicas share the consumer.

Make-before-break rotations (docs/decisions/0085-a-fresh-ip-without-downtime.md) add the proxy's
lease subject to two decisions (``leases``): whether a spec change may break first (only when nobody
holds a lease), and, after a promotion, the switch of the lease to the new instance, made good on
every reconcile until the old instance is gone; the old instance's delete waits for the drain as a
delayed redelivery.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import click
import structlog
from opentelemetry import trace

from events import subjects
from events.errors import ConcurrencyError
from events.schemas import ReplacementPromoted
from events.store import EventStore, History, NewEvent, derive_msg_id
from services.reconciler.decide import decide, unhealthy_for, wakes
from services.reconciler.decide_rotate import needs_lease, retire_in
from services.reconciler.decision import Decision
from services.reconciler.leases import is_leased, switch_lease
from services.reconciler.state import VERSION as STATE_VERSION
from services.reconciler.state import ProxyState, fold
from services.reconciler.states import STATES_BUCKET, States
from services.runtime.config import Settings
from services.runtime.consumer import ConsumerLoop, ConsumerSpec, Delivery, Outcome, Retry
from services.runtime.eventlog.snapshots import SnapshotStore
from services.runtime.metrics import Metrics
from services.runtime.options import env_option
from services.runtime.service import ServiceContext

log = structlog.get_logger("egress.reconciler")
_tracer = trace.get_tracer("egress_proxies.reconciler")

FILTERS = ("proxy.*.declared", "proxy.*.instance", "proxy.*.health", "proxy.*.rotate")
MAX_ATTEMPTS = 50
DEFAULT_DRAIN = 5.0
"""Seconds a rotated-out instance keeps serving after the switch
(docs/decisions/0085-a-fresh-ip-without-downtime.md)."""
_SPAN_BY_OUTCOME = {
    "replace": "reconcile.replaceInstance",
    "delete": "reconcile.delete",
    "removed": "reconcile.delete",
    "rotate": "reconcile.rotate",
    "promote": "reconcile.rotate",
    "retire": "reconcile.rotate",
}


def new_events(uid: str, decision: Decision, history: History, causation: str) -> list[NewEvent]:
    """Ids derive from the uid, the folded sequence and the position: the same state decided
    twice (two replicas, a redelivery) yields the same ids, stored once."""
    return [
        NewEvent(
            event,
            derive_msg_id("reconcile", uid, str(history.last_seq), str(i)),
            causation,
        )
        for i, event in enumerate(decision.events)
    ]


class Reconciler:
    def __init__(
        self,
        store: EventStore,
        metrics: Metrics,
        *,
        replace_unhealthy_after: float = 0.0,
        states: States | None = None,
        rotation_drain: float = DEFAULT_DRAIN,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.replace_unhealthy_after = replace_unhealthy_after
        self.states = states or States()
        self.rotation_drain = rotation_drain

    async def reconcile(self, uid: str, causation: str = "") -> Decision:
        """Decide and append; returns the decision that was appended (or found unneeded)."""
        decision, _ = await self._reconcile(uid, causation)
        return decision

    async def _reconcile(self, uid: str, causation: str) -> tuple[Decision, ProxyState]:
        """Fold → decide → append, re-folding on every conflict (``decide_and_append``), from
        the state ``states`` kept: only the events after it are read."""
        aggregate = subjects.proxy(uid)
        after = self.replace_unhealthy_after
        conflicts = 0
        with (
            _tracer.start_as_current_span("Reconcile Proxy", attributes={"proxy.uid": uid}),
            _tracer.start_as_current_span("reconcile.managed") as span,
        ):
            while True:
                start, as_of = await self.states.start(uid)
                history = await self.store.read(aggregate, after_seq=as_of)
                state = fold(uid, history.events, start)
                await self.states.keep(uid, state, history.last_seq, len(history.events))
                if state.retiring_id and state.promoted_rotation:
                    # Level-triggered: a crash after the promotion and before the lease's
                    # switch is made good here, always before the old instance is deleted.
                    await switch_lease(
                        self.store, uid, state.promoted_rotation, state.instance_id, state.ip
                    )
                leased = needs_lease(state) and await is_leased(self.store, uid)
                decision = decide(
                    state, datetime.now(UTC), after, leased=leased, drain=self.rotation_drain
                )
                # Named once the decision is known: the appends below are its children.
                span.update_name(_SPAN_BY_OUTCOME.get(decision.outcome, "reconcile.managed"))
                span.set_attribute("reconcile.outcome", decision.outcome)
                new = new_events(uid, decision, history, causation)
                if not new:
                    break
                try:
                    await self.store.append(aggregate, new, expected_seq=history.last_seq)
                    promoted = decision.events[0]
                    if isinstance(promoted, ReplacementPromoted):
                        await switch_lease(
                            self.store, uid, promoted.rotation_id, promoted.provider_id, promoted.ip
                        )
                    break
                except ConcurrencyError:
                    # Another writer got there first: decide again on the newer state. The
                    # bound only guards against a bug that would otherwise spin for ever.
                    conflicts += 1
                    if conflicts >= MAX_ATTEMPTS:
                        raise
        self.metrics.reconcile.labels(decision.outcome).inc()
        if decision.outcome != "noop":
            log.info(
                "reconciled",
                proxy_uid=uid,
                outcome=decision.outcome,
                events=[type(e).__name__ for e in decision.events],
                conflicts=conflicts,
            )
        return decision, state

    async def handle(self, delivery: Delivery) -> Outcome:
        if not wakes(delivery.recorded.event):
            self.metrics.reconcile.labels("skipped").inc()
            return None
        uid = subjects.proxy_uid_of(delivery.recorded.subject)
        decision, state = await self._reconcile(uid, delivery.recorded.msg_id)
        if decision.outcome == "promote":
            # Come back when the drain is over to delete the old instance: a delayed
            # redelivery, so a crash meanwhile loses nothing.
            return Retry(self.rotation_drain + 0.05, "draining")
        if state.retiring_id and state.pending is None and decision.outcome == "noop":
            remaining = retire_in(state, datetime.now(UTC), self.rotation_drain)
            return Retry(remaining + 0.05, "draining")
        if self.replace_unhealthy_after > 0 and decision.outcome != "replace":
            unhealthy = unhealthy_for(state, datetime.now(UTC))
            if unhealthy > 0:
                # Come back when the instance will have been unhealthy long enough to replace:
                # a delayed redelivery, so the wait survives a crash (no in-memory timer).
                return Retry(self.replace_unhealthy_after - unhealthy + 0.05, "unhealthy")
        return None


@dataclass
class ReconcilerService:
    name: str = "reconciler"
    concurrency: int = 64
    replace_unhealthy_after: float = 0.0
    rotation_drain: float = DEFAULT_DRAIN

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
            concurrency=self.concurrency,
            batch=min(self.concurrency, 256),
            # Waiting to replace an unhealthy instance is a delayed redelivery, which counts.
            max_deliver=100,
        )
        loop = ConsumerLoop(ctx.conn, spec, reconciler.handle, store=ctx.store, metrics=ctx.metrics)
        await loop.run()


def build(
    settings: Settings,
    *,
    reconcile_concurrency: int = 64,
    replace_unhealthy_after: float = 0.0,
    rotation_drain: float = DEFAULT_DRAIN,
) -> ReconcilerService:
    """The factory ``run reconciler`` and ``up`` call."""
    del settings  # the reconciler needs nothing beyond the ServiceContext
    return ReconcilerService(
        concurrency=reconcile_concurrency,
        replace_unhealthy_after=replace_unhealthy_after,
        rotation_drain=rotation_drain,
    )


OPTIONS: tuple[click.Option, ...] = (
    env_option(
        "--reconcile-concurrency",
        type=click.IntRange(min=1, max=4096),
        default=64,
        show_default=True,
        help="Proxies one reconciler replica decides at once.",
    ),
    env_option(
        "--replace-unhealthy-after",
        type=click.FloatRange(min=0),
        default=0.0,
        show_default=True,
        help="Seconds an instance may fail its health probes before it is replaced; 0 never "
        "replaces for health.",
    ),
    env_option(
        "--rotation-drain",
        type=click.FloatRange(min=0, max=3600),
        default=DEFAULT_DRAIN,
        show_default=True,
        help="Seconds an instance replaced make-before-break (a lease rotation, a leased "
        "proxy's spec change) keeps serving after its lease switched, so that requests already "
        "sent through it finish; then it is deleted.",
    ),
)
