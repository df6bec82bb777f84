"""One GC round with everything around the sweep: the lock, the live uids, the span, the metrics
and the ``GC`` events.

Shared by the service (every ``--gc-interval``) and ``gc run-once``, so both behave alike. A dry
run takes no lock and appends nothing: it changes nothing, so it need not wait for, or block, a
real sweep.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime

import structlog
from nats.js import JetStreamContext
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from events import subjects
from events.store import EventStore
from projections.proxy import ProxyView, apply
from services.gc.lock import SweepLock
from services.gc.pure.report import LeftoverReport, SweepReport, sweep_events
from services.gc.sweep import sweep_once
from services.providers.base import Provider
from services.runtime.eventlog.projector import Projector
from services.runtime.observability.metrics import metric_set
from services.runtime.observability.telemetry import tracer

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
        # Leftovers have counters of their own: a kind label on the ones above would change
        # their series, which dashboards and alerts already select on.
        self.leftovers = Counter(
            "egress_gc_leftovers_found_total",
            "Orphaned leftovers found (resources an instance left behind), by provider and kind",
            ["provider", "kind"],
            registry=r,
        )
        self.leftover_deletes = Counter(
            "egress_gc_leftover_deletes_total",
            "Leftover deletes by provider, kind and result (ok, in_use: kept because in use "
            "again, or the error class)",
            ["provider", "kind", "result"],
            registry=r,
        )
        self.leftovers_skipped = Counter(
            "egress_gc_leftovers_skipped_total",
            "Providers whose leftovers were skipped for a round because listing them failed",
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


def gc_metrics(registry: CollectorRegistry) -> GcMetrics:
    """One set per registry: a process that builds the service twice reuses the collectors."""
    return metric_set(registry, GcMetrics)


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
            span.set_attribute("gc.leftovers", report.leftovers)
            span.set_attribute("gc.leftovers_deleted", report.leftovers_deleted)
            if not dry_run:
                for entry in report.providers:
                    await self.store.append(
                        subjects.gc(entry.provider), sweep_events(entry, sweep_id)
                    )
        self._count(report)
        self.metrics.seconds.observe(time.perf_counter() - started)
        if report.orphans or report.skipped or report.leftovers or report.leftovers_skipped:
            log.info(
                "gc sweep",
                dry_run=dry_run,
                orphans=report.orphans,
                deleted=report.deleted,
                failed=report.failed,
                skipped_providers=report.skipped,
                leftovers=report.leftovers,
                leftovers_deleted=report.leftovers_deleted,
                leftovers_failed=report.leftovers_failed,
                leftovers_skipped=report.leftovers_skipped,
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
            if entry.leftovers is not None:
                self._count_leftovers(entry.provider, entry.leftovers)

    def _count_leftovers(self, provider: str, report: LeftoverReport) -> None:
        if report.skipped:
            self.metrics.leftovers_skipped.labels(provider).inc()
        kinds = {lo.provider_id: lo.kind for lo in report.orphans}
        for leftover in report.orphans:
            self.metrics.leftovers.labels(provider, leftover.kind).inc()
        for pid in report.deleted:
            self.metrics.leftover_deletes.labels(provider, kinds[pid], "ok").inc()
        for pid in report.in_use:
            self.metrics.leftover_deletes.labels(provider, kinds[pid], "in_use").inc()
        for failure in report.failed:
            kind = kinds[failure.provider_id]
            self.metrics.leftover_deletes.labels(provider, kind, failure.error_class).inc()
