"""The executor service: the command consumer and the observe sweep, over named providers.

Both halves share the providers (each wrapped for metrics and client spans) and are stateless
between messages and rounds: everything they know is in the event log, so replicas can be added
or killed at any time. Durable waits go through JetStream's delayed redelivery, which is why the
consumer's delivery limit is high: a slow instance is polled many times before it runs, and only
a handler that keeps *failing* should ever reach the dead-letter stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, ClassVar

import msgspec
import structlog

from events import subjects
from services.executor.commands import CommandHandler
from services.executor.meter import Meter, default_replica, meter_metrics, upstream_providers
from services.executor.observe import ObserveSweep
from services.executor.pure.policy import CommandPolicy
from services.providers.base import Provider
from services.providers.config import (
    ProviderEntry,
    ProviderSettings,
    build_providers,
    check_lease_secret,
    load_providers_config,
)
from services.providers.entrycheck import log_at_start
from services.providers.instrumented import instrument
from services.providers.squidauth.secret import LEASE_SECRET_VARIABLES
from services.runtime.nats.consumer import ConsumerLoop, ConsumerSpec
from services.runtime.observability.metrics import Metrics
from services.runtime.service import ServiceContext
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import setting

log = structlog.get_logger("egress.executor")

DURABLE = "executor"
COMMAND_SUBJECTS = ("proxy.*.cmd",)


class ExecutorSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What ``run executor`` takes (docs/decisions/0148-one-settings-struct-per-service.md)."""

    reads_env: ClassVar[tuple[str, ...]] = LEASE_SECRET_VARIABLES
    providers: ProviderSettings = msgspec.field(default_factory=ProviderSettings)
    observe_interval: Annotated[
        float,
        setting(
            "Seconds between sweeps that look for Ready instances which stopped or vanished.",
            gt=0,
        ),
    ] = 10.0
    create_timeout: Annotated[
        float,
        setting(
            "Seconds an instance may take to run before the create is answered as failed "
            "(Transient), so the reconciler replaces it.",
            gt=0,
        ),
    ] = 600.0
    meter_interval: Annotated[
        float,
        setting(
            "Seconds between reads of the upstream proxies' access logs into the METER stream "
            "(docs/decisions/0161-metering-upstream-bytes.md).",
            gt=0,
            le=3600,
        ),
    ] = 10.0


DEFAULTS = ExecutorSettings()


def consumer_spec(*, ack_wait: float = 30.0, concurrency: int = 64) -> ConsumerSpec:
    """Deliveries count every poll of a Pending instance (at most one per ``poll_max``), so
    10,000 outlasts any create timeout by far while still bounding a handler that always fails.
    """
    return ConsumerSpec(
        stream=subjects.PROXY_STREAM,
        durable=DURABLE,
        filter_subjects=COMMAND_SUBJECTS,
        ack_wait=ack_wait,
        max_deliver=10_000,
        batch=concurrency,
        concurrency=concurrency,
    )


class ExecutorService:
    name = "executor"

    def __init__(
        self,
        providers_config: Path | None,
        data_dir: Path,
        observe_interval: float = DEFAULTS.observe_interval,
        create_timeout: float = DEFAULTS.create_timeout,
        *,
        meter_interval: float = DEFAULTS.meter_interval,
        providers: Mapping[str, Provider] | None = None,
        policy: CommandPolicy | None = None,
        ack_wait: float = 30.0,
        concurrency: int = 64,
        observe_concurrency: int = 16,
    ) -> None:
        """``providers`` replaces the config file (tests, embedding); ``policy`` overrides the
        wait and retry delays, and its create timeout wins over ``create_timeout``."""
        if observe_interval <= 0:
            raise ConfigError(
                f"--observe-interval: {observe_interval} must be > 0 seconds (e.g. 10)"
            )
        if create_timeout <= 0:
            raise ConfigError(f"--create-timeout: {create_timeout} must be > 0 seconds (e.g. 600)")
        if not 0 < meter_interval <= 3600:
            raise ConfigError(
                f"--meter-interval: {meter_interval} must be in (0, 3600] seconds (e.g. 10)"
            )
        self.meter_interval = meter_interval
        self.providers_config = providers_config
        self.data_dir = data_dir
        self.observe_interval = observe_interval
        self.policy = policy or CommandPolicy(create_timeout=create_timeout)
        self.ack_wait = ack_wait
        self.concurrency = concurrency
        self.observe_concurrency = observe_concurrency
        self._given = providers
        self._entries: list[ProviderEntry] = []
        self._raw: dict[str, Provider] = {}

    def load_providers(self, metrics: Metrics) -> dict[str, Provider]:
        """Fails at start-up on a bad config: an executor without its providers would ack
        every command with "unknown provider" and latch the whole fleet Failed."""
        if self._given is not None:
            raw = dict(self._given)
        else:
            entries = load_providers_config(self.providers_config, default_data_dir=self.data_dir)
            raw = build_providers(entries)
            self._entries = entries
        self._raw = raw
        return {name: instrument(p, metrics) for name, p in raw.items()}

    async def run(self, ctx: ServiceContext) -> None:
        providers = self.load_providers(ctx.metrics)
        handler = CommandHandler(ctx.store, providers, policy=self.policy, metrics=ctx.metrics)
        loop = ConsumerLoop(
            ctx.conn,
            consumer_spec(ack_wait=self.ack_wait, concurrency=self.concurrency),
            handler,
            store=ctx.store,
            metrics=ctx.metrics,
        )
        sweep = ObserveSweep(
            ctx.conn.js, ctx.store, providers, concurrency=self.observe_concurrency
        )
        upstream = upstream_providers(self._raw)
        meter = Meter(
            ctx.store,
            upstream,
            meter_metrics(ctx.metrics.registry),
            replica=default_replica(),
        )
        log.info(
            "executor started",
            providers={name: p.type for name, p in providers.items()},
            observe_interval=self.observe_interval,
            create_timeout=self.policy.create_timeout,
        )
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(loop.run(), name="executor-commands")
                group.create_task(sweep.run(self.observe_interval), name="executor-observe")
                if upstream:
                    group.create_task(meter.run(self.meter_interval), name="executor-meter")
                if self._entries:
                    # In the background: a cloud slow to answer must not delay the fleet (D144).
                    group.create_task(log_at_start(self._entries), name="executor-preflight")
        finally:
            await close_all(providers)


async def close_all(providers: Mapping[str, Provider]) -> None:
    for name, provider in providers.items():
        try:
            await provider.close()
        except Exception as exc:
            # Shutting down anyway: one provider's failing close must not keep the others open.
            log.warning("provider close failed", provider=name, error=str(exc))


def build(settings: Settings, config: ExecutorSettings) -> ExecutorService:
    """The factory ``run executor`` and ``up`` call. The providers file is validated here, so a
    typo in it stops the command before a nats-server or any other service has started, and so
    does a missing lease secret (D84)."""
    del settings  # everything the executor needs from it arrives through the ServiceContext
    providers = config.providers
    providers.apply()
    data_dir = providers.data_dir.resolve()
    check_lease_secret(load_providers_config(providers.providers_config, default_data_dir=data_dir))
    return ExecutorService(
        providers.providers_config,
        data_dir,
        config.observe_interval,
        config.create_timeout,
        meter_interval=config.meter_interval,
    )
