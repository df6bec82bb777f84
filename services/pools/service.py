"""The pool controller service: every ``--pool-interval``, each pool is evaluated
(``controller.Controller``) on views kept current by push.

It reads three streams into memory (the pools, and the shared proxy and lease folds its members
are judged by), as discovery does; the decisions it makes go to each pool's aggregate first, so
any number of replicas may run: they meet at the pool's optimistic concurrency, and the one that
loses finds the decision made. An evaluation that fails (NATS briefly away, a conflict storm) is
logged and the pool is evaluated again at the next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import msgspec
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from events import subjects
from events.errors import EventStoreError
from projections import lease as lease_fold
from projections import pool as pool_fold
from projections import pool_demand as demand_fold
from projections import proxy as proxy_fold
from projections.lease import LeaseView
from projections.pool import PoolView
from projections.pool_demand import DemandView
from projections.pool_members import figures, member_states
from projections.proxy import ProxyView
from services.pools.controller import Controller, Outcome
from services.runtime.aio import raise_if_cancelled
from services.runtime.eventlog.projector import Projector
from services.runtime.observability.metrics import metric_set
from services.runtime.service import ServiceContext
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import setting

log = structlog.get_logger("egress.pools")


class PoolsSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What ``run pools`` takes (docs/decisions/0148-one-settings-struct-per-service.md)."""

    pool_interval: Annotated[
        float,
        setting(
            "Seconds between two evaluations of every pool by one pool controller replica.",
            ge=0.05,
            le=3600,
        ),
    ] = 1.0


DEFAULT_INTERVAL = PoolsSettings().pool_interval


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        # Not "namespace": a Kubernetes scrape sets that label to the pod's namespace.
        labels = ["pool_namespace", "pool"]
        self.desired = Gauge(
            "egress_proxies_pool_desired", "Members the pool asks for", labels, registry=r
        )
        self.members = Gauge(
            "egress_proxies_pool_members", "Members the pool has planned", labels, registry=r
        )
        self.ready = Gauge("egress_proxies_pool_ready", "Members Ready", labels, registry=r)
        self.healthy = Gauge(
            "egress_proxies_pool_healthy", "Members Ready and healthy", labels, registry=r
        )
        self.leased = Gauge("egress_proxies_pool_leased", "Members leased", labels, registry=r)
        self.decisions = Counter(
            "egress_proxies_pool_decisions_total",
            "Decisions this replica recorded, by reason",
            ["reason"],
            registry=r,
        )
        self.errors = Counter(
            "egress_proxies_pool_evaluation_errors_total",
            "Evaluations that failed (and are tried again at the next tick)",
            registry=r,
        )

    def show(
        self, pool: PoolView, proxies: dict[str, ProxyView], leases: dict[str, LeaseView]
    ) -> None:
        now = datetime.now(UTC)
        seen = figures(pool, member_states(pool.members.values(), proxies, leases, now))
        labels = (pool.namespace, pool.name)
        if pool.removed:
            for gauge in (self.desired, self.members, self.ready, self.healthy, self.leased):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
            return
        self.desired.labels(*labels).set(seen.desired)
        self.members.labels(*labels).set(seen.members)
        self.ready.labels(*labels).set(seen.ready)
        self.healthy.labels(*labels).set(seen.healthy)
        self.leased.labels(*labels).set(seen.leased)


class PoolViews:
    """The three folds an evaluation reads, caught up at start and then followed by push."""

    def __init__(self, ctx: ServiceContext) -> None:
        js = ctx.conn.js
        self.nc = ctx.conn.nc
        self.pools: Projector[PoolView] = Projector(
            js, subjects.POOL_STREAM, "pool.*.*", pool_fold.apply
        )
        self.proxies: Projector[ProxyView] = Projector(
            js, subjects.PROXY_STREAM, "proxy.*.*", proxy_fold.apply
        )
        self.leases: Projector[LeaseView] = Projector(
            js, subjects.LEASE_STREAM, "lease.*", lease_fold.apply
        )
        self.demand: Projector[DemandView] = Projector(
            js, subjects.DEMAND_STREAM, "demand.*", demand_fold.apply
        )
        self.all = (self.pools, self.proxies, self.leases, self.demand)

    async def catch_up(self) -> None:
        for projector in self.all:
            await projector.catch_up()

    async def follow(self) -> None:
        async with asyncio.TaskGroup() as group:
            for projector in self.all:
                group.create_task(projector.follow(self.nc))


@dataclass
class PoolsService:
    name: str = "pools"
    interval: float = DEFAULT_INTERVAL

    async def run(self, ctx: ServiceContext) -> None:
        views = PoolViews(ctx)
        await views.catch_up()
        metrics = metric_set(ctx.metrics.registry, PoolMetrics)
        controller = Controller(ctx.store)
        follower = asyncio.create_task(views.follow())
        try:
            while True:
                raise_if_cancelled()
                if follower.done():
                    follower.result()  # a follower that ended ends the service, loudly
                views.pools.changed.clear()
                outcomes = await tick(controller, views, metrics)
                # A decision cut at its bound is followed at once: a pool of 1,000 is not left
                # to grow by 100 members a tick.
                if not any(o.more for o in outcomes):
                    await pause(views, self.interval)
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower


WAKE_CHECK = 0.05
"""How often a pause looks for a pool event: the delay a declaration or a scale waits at most."""


async def pause(views: PoolViews, interval: float) -> None:
    """Until the next evaluation: ``interval``, or less when a pool's log moved (a pool
    declared, scaled, changed or deleted; a decision of another replica), so what people ask
    is acted on within ``WAKE_CHECK``, not at the next tick."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + interval
    while (left := deadline - loop.time()) > 0:
        if views.pools.changed:
            return
        await asyncio.sleep(min(WAKE_CHECK, left))


async def tick(controller: Controller, views: PoolViews, metrics: PoolMetrics) -> list[Outcome]:
    """Evaluate every pool once; a pool whose evaluation fails is logged and left to the next."""
    outcomes = []
    proxies, leases = views.proxies.views, views.leases.views
    for pool in list(views.pools.views.values()):
        if pool.removed:
            metrics.show(pool, proxies, leases)
            continue
        try:
            now = datetime.now(UTC)
            demand = demand_fold.current(views.demand.views.get(pool.uid), now)
            outcome = await controller.evaluate(pool, proxies, leases, now, demand)
        except EventStoreError as exc:
            metrics.errors.inc()
            log.warning("pool evaluation failed; trying again", pool=pool.name, error=str(exc))
            continue
        decision = outcome.decision
        if decision is not None:
            metrics.decisions.labels(decision.reason).inc()
            log.info(
                "pool decided",
                pool=f"{pool.namespace}/{pool.name}",
                reason=decision.reason,
                message=decision.message,
            )
        if outcome.refused:
            log.warning(
                "a member's name is held by a Proxy the pool does not own; not taken over",
                pool=f"{pool.namespace}/{pool.name}",
                members=outcome.refused,
            )
        metrics.show(pool, proxies, leases)
        outcomes.append(outcome)
    return outcomes


def build(settings: Settings, config: PoolsSettings) -> PoolsService:
    """The factory ``run pools`` and ``up`` call."""
    del settings
    return PoolsService(interval=config.pool_interval)
