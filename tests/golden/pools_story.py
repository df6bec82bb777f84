"""The golden pool: ``de`` in namespace ``golden``, as the CLI and the pool controller write it.

Declared with two members, the controller's decisions (its own ``Controller`` on the golden
log's store, deciding at the log's fixed times), scaled to one, its template changed, deleted:
its last member retired and removed, then the pool. Appended after the proxies' story, so the
schema's log keeps every line it had (tests/golden/README.md).
"""

from __future__ import annotations

import asyncio

from events import subjects
from events.pool import (
    Autoscale,
    PoolDeclared,
    PoolDeletionRequested,
    PoolScaled,
    PoolSpec,
    PoolSpecChanged,
)
from events.poolresource import pool_uid
from events.schemas import Event, HealthCheck, ProxyRemoved, ProxySpec
from events.store import NewEvent, derive_msg_id
from projections import pool as pool_fold
from projections import pool_demand
from projections import proxy as proxy_fold
from projections.proxy import ProxyView
from services.discovery.leasing.demand import Asker, DemandReporter
from services.pools.controller import Controller
from tests.golden.writers import GoldenLog, reconcile

SPEC = PoolSpec(
    replicas=2,
    template=ProxySpec(
        provider="local",
        attributes={"country": "de"},
        health_check=HealthCheck(interval_seconds=5.0),
    ),
    max_age_seconds=6 * 3600.0,
    recycle_on_blocks=3,
    max_surge=1,
)


def _proxies(log: GoldenLog) -> dict[str, ProxyView]:
    views: dict[str, ProxyView] = {}
    for m in log.messages:
        if m.stream == subjects.PROXY_STREAM:
            uid = subjects.proxy_uid_of(m.subject)
            view = proxy_fold.fold([*log.history(subjects.proxy(uid)).events])
            if view is not None:
                views[uid] = view
    return views


def _evaluate(log: GoldenLog, uid: str) -> list[str]:
    """One evaluation by the pool controller; the members it declared or deleted."""
    pool = pool_fold.fold(list(log.history(subjects.pool(uid)).events))
    assert pool is not None
    log.later(1.0)
    demand = pool_demand.current(_demand(log, uid), log.now)
    outcome = asyncio.run(Controller(log).evaluate(pool, _proxies(log), {}, log.now, demand))
    return [*outcome.declared, *outcome.deleted]


def _demand(log: GoldenLog, uid: str) -> pool_demand.DemandView | None:
    view = None
    for recorded in log.history(subjects.demand(uid)).events:
        view = pool_demand.apply(view, recorded)
    return view


def _pool_event(log: GoldenLog, uid: str, event: Event, what: str) -> None:
    log.store(subjects.pool(uid), NewEvent(event, derive_msg_id(uid, what)), after=2.0)


def the_life_of_pool_de(log: GoldenLog) -> None:
    uid = pool_uid("golden", "de")
    declared = PoolDeclared(uid=uid, namespace="golden", name="de", spec=SPEC)
    _pool_event(log, uid, declared, "declared")
    assert len(_evaluate(log, uid)) == 2  # ScaleUp: two members declared
    _pool_event(log, uid, PoolScaled(uid=uid, replicas=1), "scaled-1")
    assert len(_evaluate(log, uid)) == 1  # ScaleDown: one retired
    tiered = PoolSpec(
        replicas=1,
        template=ProxySpec(provider="local", attributes={"country": "de", "tier": "gold"}),
        max_age_seconds=SPEC.max_age_seconds,
    )
    _pool_event(log, uid, PoolSpecChanged(uid=uid, spec=tiered, generation=2), "spec-2")
    _pool_event(log, uid, PoolDeletionRequested(uid=uid), "delete")
    assert len(_evaluate(log, uid)) == 1  # Deleting: the last member retired
    pool = pool_fold.fold(list(log.history(subjects.pool(uid)).events))
    assert pool is not None
    for planned in pool.members.values():
        reconcile(log, planned.member.uid, ProxyRemoved)
    _evaluate(log, uid)  # every member gone: PoolRemoved
    pool = pool_fold.fold(list(log.history(subjects.pool(uid)).events))
    assert pool is not None
    assert pool.removed


def the_autoscaled_pool_busy(log: GoldenLog) -> None:
    """``busy``, autoscaled from 1 to 3 members: three crawlers ask discovery for it and none is
    served; the replica reports the three it could not serve (``PoolDemand``), the controller
    records the load turning up (``PoolPressure``) and, ``scaleUpAfter`` later, scales to three
    (``PoolDecided`` with ``scaled_to``); then the demand ends (a report of nothing), and the
    pool is deleted."""
    uid = pool_uid("golden", "busy")
    spec = PoolSpec(
        template=ProxySpec(provider="local", attributes={"country": "de"}),
        autoscale=Autoscale(
            min=1,
            max=3,
            target_leased=1.0,
            scale_up_after_seconds=10.0,
            scale_down_after_seconds=60.0,
        ),
    )
    declared = PoolDeclared(uid=uid, namespace="golden", name="busy", spec=spec)
    _pool_event(log, uid, declared, "declared")
    assert len(_evaluate(log, uid)) == 1  # Autoscale: held within 1..3, one member
    reporter = DemandReporter(log, replica="discovery-golden", interval=5.0)
    reporter.waiting(uid, Asker("", "crawler-1"), 1)
    reporter.waiting(uid, Asker("", "crawler-2"), 1)
    reporter.refused(uid, Asker("", "crawler-3"), "busy")
    log.later(1.0)
    assert asyncio.run(reporter.report_once()) == 1
    assert _evaluate(log, uid) == []  # Pressure: up
    log.later(10.0)
    assert len(_evaluate(log, uid)) == 2  # Autoscale: 1 -> 3
    reporter.waiting(uid, Asker("", "crawler-1"), -1)
    reporter.waiting(uid, Asker("", "crawler-2"), -1)
    log.later(1.0)
    assert asyncio.run(reporter.report_once()) == 1  # unserved now none
    pool = pool_fold.fold(list(log.history(subjects.pool(uid)).events))
    assert pool is not None
    assert pool.replicas == 3
    # Deleted, as pool de is, so the log ends with de-1 the only Proxy.
    _pool_event(log, uid, PoolDeletionRequested(uid=uid), "delete")
    assert len(_evaluate(log, uid)) == 3  # Deleting: every member retired
    pool = pool_fold.fold(list(log.history(subjects.pool(uid)).events))
    assert pool is not None
    for planned in pool.members.values():
        reconcile(log, planned.member.uid, ProxyRemoved)
    _evaluate(log, uid)  # PoolRemoved
    pool = pool_fold.fold(list(log.history(subjects.pool(uid)).events))
    assert pool is not None
    assert pool.removed
