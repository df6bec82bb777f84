"""The health service: probes every Ready proxy through itself and records verdict changes.

Three loops share the work of one replica: a projection of the ``PROXY`` stream (which proxies are
Ready, at which URL, with which check settings, and what verdict the log holds), the membership
heartbeat (which replicas are alive, so which proxies are ours), and a sync every heartbeat that
starts or stops per-proxy probe tasks accordingly (``scheduler.Prober``). Unless
``--failed-reports-recheck`` is 0, a fourth follows the ``LEASE`` stream: a proxy whose holders
reported it ``failed`` that many times in a row is probed at once (``reports.FailedReports``).

Nothing here is durable state: a restarted replica rebuilds the projection, rejoins, and continues
from the verdicts in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, ClassVar

import msgspec
import structlog

from events import subjects
from events.errors import EventStoreError
from projections.proxy import ProxyView, apply
from services.health.assign import Membership, default_replica_id
from services.health.credentials import ProbeCredentials
from services.health.egress import EgressChecker, EgressSettings
from services.health.egress_options import EgressFlags, egress_settings
from services.health.geoip import GeoLookup, open_lookup
from services.health.metrics import HealthMetrics, health_metrics
from services.health.probe_client import CheckUrl, ProbeClient, provider_check_urls
from services.health.pure.recheck import (
    DEFAULT_FAILED_REPORTS_RECHECK,
    MAX_FAILED_REPORTS_RECHECK,
    check_every,
)
from services.health.reports import FailedReports
from services.health.scheduler import DEFAULT_KEEP_ALIVE_SECONDS, Prober
from services.providers.squidauth.secret import LEASE_SECRET_VARIABLES, master_secret_from_env
from services.runtime.aio import raise_if_cancelled
from services.runtime.eventlog.projector import Projector
from services.runtime.service import ServiceContext
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import setting

log = structlog.get_logger("egress.health")


class HealthSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What ``run health`` takes (docs/decisions/0148-one-settings-struct-per-service.md)."""

    reads_env: ClassVar[tuple[str, ...]] = LEASE_SECRET_VARIABLES
    egress: EgressFlags = msgspec.field(default_factory=EgressFlags)
    check_url: Annotated[
        str,
        setting(
            "URL fetched through each proxy when its spec.healthCheck.url is empty; an "
            "answer 200-399 is a success.",
            flag="--health-check-url",
        ),
    ] = "http://connectivitycheck.gstatic.com/generate_204"
    provider_check_url: Annotated[
        tuple[str, ...],
        setting(
            "For the proxies of provider instance NAME, fetch URL instead of "
            "--health-check-url (repeatable); spec.healthCheck.url still wins.",
            env=None,
            metavar="NAME=URL",
            show_default=False,
        ),
    ] = ()
    latency_band_ms: Annotated[
        float,
        setting(
            "Record a healthy proxy's latency again when its moving average moves by more than "
            "this; 0 records none.",
            env="HEALTH_LATENCY_BAND_MS",
            ge=0,
        ),
    ] = 250.0
    trace_health_probes: Annotated[
        bool,
        setting(
            "Emit one health.probe client span per probe (when tracing is on); the probe "
            "request itself never carries trace headers.",
            show_default=False,
        ),
    ] = False
    health_concurrency: Annotated[
        int, setting("Probes one health replica has in flight at once.", ge=1, le=65536)
    ] = 256
    health_heartbeat: Annotated[
        float,
        setting(
            "Seconds between a health replica's membership heartbeats; a replica silent for "
            "three is considered gone and its proxies move to the others.",
            ge=0.1,
        ),
    ] = 1.0
    health_keep_alive: Annotated[
        float,
        setting(
            "Keep a proxy's connection open between probes when its intervalSeconds is at most "
            "this many seconds; probes further apart open a connection each time and close it "
            "(an idle connection costs about 3 KB for the whole interval; a connect about 0.4 "
            "ms of CPU). 0 keeps none. An https check URL keeps its tunnel at any interval.",
            ge=0,
        ),
    ] = DEFAULT_KEEP_ALIVE_SECONDS
    failed_reports_recheck: Annotated[
        int,
        setting(
            "Probe a proxy at once, instead of at its next turn, when its lease holders have "
            "reported it failed this many times in a row (and again at each further multiple); "
            "0 turns this off.",
            env="HEALTH_FAILED_REPORTS_RECHECK",
            ge=0,
            le=MAX_FAILED_REPORTS_RECHECK,
        ),
    ] = DEFAULT_FAILED_REPORTS_RECHECK


DEFAULTS = HealthSettings()
DEFAULT_CHECK_URL = DEFAULTS.check_url


@dataclass
class HealthService:
    name: str = "health"
    check_url: str = DEFAULT_CHECK_URL
    """Probed when a proxy's ``spec.healthCheck.url`` is empty."""
    provider_check_urls: dict[str, str] = field(default_factory=dict)
    """Per provider instance: what is probed instead of ``check_url`` for its proxies."""
    latency_band_ms: float = DEFAULTS.latency_band_ms
    concurrency: int = DEFAULTS.health_concurrency
    trace_probes: bool = DEFAULTS.trace_health_probes
    heartbeat: float = DEFAULTS.health_heartbeat
    keep_alive_seconds: float = DEFAULT_KEEP_ALIVE_SECONDS
    """A proxy probed at most this many seconds apart keeps its connection between probes."""
    failed_reports_recheck: int = DEFAULT_FAILED_REPORTS_RECHECK
    """Probe a proxy at once when its consecutive ``failed`` reports reach a multiple of this;
    0: never (the ``LEASE`` stream is not read at all)."""
    replica_id: str = field(default_factory=default_replica_id)
    lease_secret: bytes | None = field(default=None, repr=False)
    """The master lease secret: probes carry the probe credential minted with it (D84)."""
    client: ProbeClient = field(default_factory=ProbeClient)
    egress: EgressSettings | None = None
    """Egress checks (docs/decisions/0111-verified-egress.md); None: none."""
    geoip_db: tuple[Path, ...] = ()
    """MaxMind databases to place addresses with; empty: the data geoip2fast ships."""
    prober: Prober | None = field(default=None, init=False)
    """Set while running (tests and the benchmark read its counters)."""
    membership: Membership | None = field(default=None, init=False)
    reports: FailedReports | None = field(default=None, init=False)
    """Set while running with ``failed_reports_recheck`` above 0."""

    def __post_init__(self) -> None:
        check_every(self.failed_reports_recheck)

    async def run(self, ctx: ServiceContext) -> None:
        metrics = health_metrics(ctx.metrics.registry)
        projector: Projector[ProxyView] = Projector(
            ctx.conn.js, subjects.PROXY_STREAM, "proxy.*.*", apply
        )
        membership = self.membership = Membership(
            ctx.conn.js, self.replica_id, heartbeat=self.heartbeat
        )
        if self.lease_secret:
            self.client.proxy_auth = ProbeCredentials(self.lease_secret, lambda: projector.views)
        else:
            log.warning(
                "no lease secret (EGRESS_LEASE_SECRET): proxies that enforce leases will answer "
                "the probes 407; give health the same lease secret as the executor"
            )
        prober = self.prober = Prober(
            ctx.store,
            projector,
            self.client,
            metrics,
            default_check_url=self.check_url,
            provider_check_urls=self.provider_check_urls,
            latency_band_ms=self.latency_band_ms,
            concurrency=self.concurrency,
            trace_probes=self.trace_probes,
            keep_alive_seconds=self.keep_alive_seconds,
            egress=self._egress_checker(ctx, metrics),
        )
        reports = self.reports = (
            FailedReports(ctx.conn.js, self.failed_reports_recheck)
            if self.failed_reports_recheck
            else None
        )
        log.info(
            "health prober starting",
            replica=self.replica_id,
            check_url=self.check_url,
            provider_check_urls=self.provider_check_urls,
            trace_probes=self.trace_probes,
            keep_alive_seconds=self.keep_alive_seconds,
            failed_reports_recheck=self.failed_reports_recheck,
        )
        try:
            await projector.catch_up()
            if reports is not None:
                await reports.catch_up()
            await membership.join()
            async with asyncio.TaskGroup() as group:
                group.create_task(
                    self._follow(projector.step, projector.idle_timeout, projector.stream),
                    name="health projector",
                )
                if reports is not None:
                    group.create_task(
                        self._follow(
                            lambda: self._recheck_step(reports, prober, membership),
                            reports.projector.idle_timeout,
                            reports.projector.stream,
                        ),
                        name="health failed reports",
                    )
                group.create_task(membership.run(), name="health heartbeat")
                group.create_task(self._sync(prober, membership), name="health sync")
        finally:
            await prober.close()
            with contextlib.suppress(Exception):
                await membership.leave()
            await projector.close()
            if reports is not None:
                await reports.close()

    def _egress_checker(self, ctx: ServiceContext, metrics: HealthMetrics) -> EgressChecker | None:
        if self.egress is None:
            return None
        lookup: Callable[[], GeoLookup] = functools.cache(
            functools.partial(open_lookup, self.geoip_db)
        )
        return EgressChecker(ctx.store, self.client, lookup, self.egress, metrics)

    @staticmethod
    async def _follow(step: Callable[[], Awaitable[object]], idle: float, stream: str) -> None:
        """``Projector.run`` with a cancellation check after every step (``raise_if_cancelled``):
        a replica whose connection died must still stop when told to."""
        while True:
            try:
                await step()
            except EventStoreError as exc:
                log.warning("health projection cannot read yet", stream=stream, error=str(exc))
                raise_if_cancelled()
                await asyncio.sleep(idle)
            raise_if_cancelled()

    @staticmethod
    async def _recheck_step(reports: FailedReports, prober: Prober, membership: Membership) -> int:
        """One batch of the ``LEASE`` stream; each proxy it made due is probed at once if this
        replica owns and probes it."""
        return await reports.step(lambda uid, streak: prober.recheck(uid, streak, membership.owns))

    async def _sync(self, prober: Prober, membership: Membership) -> None:
        while True:
            prober.metrics.members.set(len(membership.members))
            prober.sync(membership.owns)
            await asyncio.sleep(min(self.heartbeat, 1.0))


def build(settings: Settings, config: HealthSettings) -> HealthService:
    """The factory ``run health`` and ``up`` call; a setting that cannot work fails here."""
    del settings  # the prober needs nothing beyond the ServiceContext
    egress, geoip_db = egress_settings(config.egress)
    try:
        CheckUrl.parse(config.check_url)
    except ValueError as exc:
        raise ConfigError(f"--health-check-url / HEALTH_CHECK_URL: {exc}") from exc
    try:
        check_every(config.failed_reports_recheck)
    except ValueError as exc:
        raise ConfigError(
            f"--failed-reports-recheck / HEALTH_FAILED_REPORTS_RECHECK: {exc}"
        ) from exc
    return HealthService(
        check_url=config.check_url,
        provider_check_urls=provider_check_urls(config.provider_check_url),
        latency_band_ms=config.latency_band_ms,
        concurrency=config.health_concurrency,
        trace_probes=config.trace_health_probes,
        heartbeat=config.health_heartbeat,
        keep_alive_seconds=config.health_keep_alive,
        failed_reports_recheck=config.failed_reports_recheck,
        lease_secret=master_secret_from_env(),
        egress=egress,
        geoip_db=geoip_db,
    )
