"""One GC round with everything around the sweep: the lock, the live uids, the span, the metrics
and the ``GC`` events.

Shared by the service (every ``--gc-interval``) and ``gc run-once``, so both behave alike. A dry
run takes no lock and appends nothing: it changes nothing, so it need not wait for, or block, a
real sweep.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime

import structlog
from nats.js import JetStreamContext
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from events import subjects
from events.schemas import Event, OrphanDeleted, OrphanFound, SweepCompleted
from events.store import EventStore, NewEvent, derive_msg_id
from projections.projector import Projector
from projections.proxy import ProxyView, apply
from services.executor.providers.base import Provider
from services.gc.lock import SweepLock
from services.gc.sweep import ProviderReport, SweepReport, sweep_once
from services.runtime.telemetry import tracer

log = structlog.get_logger("egress.gc")
_tracer = tracer("egress.gc")


class GcMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.sweeps = Counter(
            "egress_gc_sweeps_total",
            "GC rounds by result (swept; busy: another replica held the lock; failed)",
            ["result"],
            registry=r,
        )
        self.orphans = Counter(
            "egress_gc_orphans_found_total", "Orphans found, by provider", ["provider"], registry=r
        )
        self.deletes = Counter(
            "egress_gc_deletes_total",
            "Orphan deletes by provider and result (ok or the error class)",
            ["provider", "result"],
            registry=r,
        )
        self.skipped = Counter(
            "egress_gc_providers_skipped_total",
            "Providers skipped for a round because their listing failed",
            ["provider"],
            registry=r,
        )
        self.last_sweep = Gauge(
            "egress_gc_last_sweep_timestamp_seconds",
            "When this replica last finished a sweep (Unix time)",
            registry=r,
        )
        self.seconds = Histogram(
            "egress_gc_sweep_seconds", "Time one sweep took, listings and deletes", registry=r
        )


_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, GcMetrics] = weakref.WeakKeyDictionary()


def gc_metrics(registry: CollectorRegistry) -> GcMetrics:
    """One set per registry: a process that builds the service twice reuses the collectors."""
    metrics = _by_registry.get(registry)
    if metrics is None:
        metrics = _by_registry[registry] = GcMetrics(registry)
    return metrics


def sweep_events(report: ProviderReport, sweep_id: str) -> list[NewEvent]:
    """A provider's round as events; ids derive from the sweep and the instance, so a retried
    append within the round is stored once."""

    def new(event: Event, *parts: str) -> NewEvent:
        return NewEvent(event, derive_msg_id("gc", sweep_id, report.provider, *parts))

    out: list[NewEvent] = []
    for instance in report.orphans:
        pid, owner = instance.provider_id, instance.owner_uid
        found = OrphanFound(
            provider=report.provider,
            provider_id=pid,
            owner_uid=owner,
            created_at=instance.created_at.isoformat(),
            sweep_id=sweep_id,
        )
        out.append(new(found, "found", pid))
    failures = {f.provider_id: f for f in report.failed}
    for instance in report.orphans:
        pid, owner = instance.provider_id, instance.owner_uid
        failure = failures.get(pid)
        if failure is None and pid not in report.deleted:
            continue
        result = OrphanDeleted(
            provider=report.provider,
            provider_id=pid,
            owner_uid=owner,
            sweep_id=sweep_id,
            ok=failure is None,
            error_class=failure.error_class if failure else "",
            error=failure.error if failure else "",
        )
        out.append(new(result, "deleted", pid))
    summary = SweepCompleted(
        provider=report.provider,
        listed=report.listed,
        orphans=len(report.orphans),
        deleted=len(report.deleted),
        skipped=report.skipped,
        reason=report.reason,
        sweep_id=sweep_id,
        failed=len(report.failed),
        young=report.young,
    )
    out.append(new(summary, "completed"))
    return out


class GarbageCollector:
    """Keeps one proxy projection across rounds, so each round reads only what is new."""

    def __init__(
        self,
        js: JetStreamContext,
        store: EventStore,
        providers: Mapping[str, Provider],
        *,
        grace: float,
        lock: SweepLock,
        registry: CollectorRegistry,
        concurrency: int = 8,
    ) -> None:
        self.store = store
        self.providers = providers
        self.grace = grace
        self.lock = lock
        self.concurrency = concurrency
        self.metrics = gc_metrics(registry)
        self.projector: Projector[ProxyView] = Projector(
            js, subjects.PROXY_STREAM, "proxy.*.*", apply
        )

    async def live_uids(self) -> AbstractSet[str]:
        """Every proxy that has not been removed: deleting ones stay live (see ``sweep``)."""
        await self.projector.catch_up()
        return {uid for uid, view in self.projector.views.items() if not view.removed}

    async def run_once(self, *, dry_run: bool = False) -> SweepReport | None:
        """One round; None when another replica holds the lock (dry runs take none)."""
        if dry_run:
            return await self._sweep(datetime.now(UTC), "", dry_run=True)
        async with self.lock.hold() as held:
            if held is None:
                self.metrics.sweeps.labels("busy").inc()
                log.debug("gc sweep skipped: another replica holds the lock")
                return None
            sweep_id = f"{held.taken_at:%Y%m%dT%H%M%S}-{held.revision}"
            return await self._sweep(held.taken_at, sweep_id, dry_run=False)

    async def close(self) -> None:
        await self.projector.close()

    async def _sweep(self, now: datetime, sweep_id: str, *, dry_run: bool) -> SweepReport:
        started = time.perf_counter()
        attributes = {"gc.providers": len(self.providers), "gc.dry_run": dry_run}
        with _tracer.start_as_current_span("gc.sweep", attributes=attributes) as span:
            try:
                report = await sweep_once(
                    self.providers,
                    self.live_uids,
                    now,
                    self.grace,
                    dry_run,
                    concurrency=self.concurrency,
                )
            except Exception:
                self.metrics.sweeps.labels("failed").inc()
                raise
            span.set_attribute("gc.deleted", report.deleted)
            span.set_attribute("gc.orphans", report.orphans)
            span.set_attribute("gc.failed", report.failed)
            span.set_attribute("gc.skipped_providers", report.skipped)
            if not dry_run:
                for entry in report.providers:
                    await self.store.append(
                        subjects.gc(entry.provider), sweep_events(entry, sweep_id)
                    )
        self._count(report)
        self.metrics.seconds.observe(time.perf_counter() - started)
        if report.orphans or report.skipped:
            log.info(
                "gc sweep",
                dry_run=dry_run,
                orphans=report.orphans,
                deleted=report.deleted,
                failed=report.failed,
                skipped_providers=report.skipped,
            )
        return report

    def _count(self, report: SweepReport) -> None:
        if report.dry_run:
            return
        self.metrics.sweeps.labels("swept").inc()
        self.metrics.last_sweep.set(time.time())
        for entry in report.providers:
            if entry.skipped:
                self.metrics.skipped.labels(entry.provider).inc()
            self.metrics.orphans.labels(entry.provider).inc(len(entry.orphans))
            self.metrics.deletes.labels(entry.provider, "ok").inc(len(entry.deleted))
            for failure in entry.failed:
                self.metrics.deletes.labels(entry.provider, failure.error_class).inc()
