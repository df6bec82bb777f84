"""The GC service: every ``--gc-interval``, one replica sweeps the providers for orphans.

Any number of replicas may run: the lock (``services.gc.lock``) lets one sweep at a time and the
others find it busy and wait for the next interval. A round that fails (NATS briefly away) is
logged and retried next interval rather than ending the process over a blip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import msgspec
import structlog

from events.durations import EXAMPLES
from services.gc.collector import GarbageCollector
from services.gc.lock import DEFAULT_TTL, SweepLock
from services.providers.base import Provider
from services.providers.config import ProviderSettings
from services.runtime.service import ServiceContext
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import setting

log = structlog.get_logger("egress.gc")


class GcSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What ``run gc`` takes (docs/decisions/0148-one-settings-struct-per-service.md)."""

    providers: ProviderSettings = msgspec.field(default_factory=ProviderSettings)
    gc_interval: Annotated[
        float, setting("Time between orphan sweeps, e.g. 30s, 5m.", gt=0, duration=True)
    ] = 300.0
    gc_grace: Annotated[
        float,
        setting(
            "Instances of no live proxy younger than this are spared (creates in flight).",
            ge=0,
            duration=True,
        ),
    ] = 600.0


DEFAULTS = GcSettings()
DEFAULT_INTERVAL = DEFAULTS.gc_interval
DEFAULT_GRACE = DEFAULTS.gc_grace


def providers_from_config(providers_config: Path | None, data_dir: Path) -> dict[str, Provider]:
    """The named providers, read the way the executor reads them."""
    # Imported here: services do not import each other at module level (the import contract);
    # where this loader lives for good is an open decision (see docs/decisions/).
    from services.providers.config import (  # noqa: PLC0415
        build_providers,
        load_providers_config,
    )

    return build_providers(load_providers_config(providers_config, default_data_dir=data_dir))


def instrumented(providers: Mapping[str, Provider], ctx: ServiceContext) -> dict[str, Provider]:
    from services.providers.instrumented import instrument  # noqa: PLC0415  # as above

    return {name: instrument(p, ctx.metrics) for name, p in providers.items()}


class GcService:
    name = "gc"

    def __init__(
        self,
        providers_config: Path | None,
        data_dir: Path,
        interval: float = DEFAULT_INTERVAL,
        grace: float = DEFAULT_GRACE,
        *,
        providers: Mapping[str, Provider] | None = None,
        lock_ttl: float = DEFAULT_TTL,
        lock_bucket: str | None = None,
    ) -> None:
        """``providers`` replaces the config file (tests, embedding)."""
        if interval <= 0:
            raise ConfigError(f"--gc-interval: {interval} must be more than 0; use {EXAMPLES}")
        if grace < 0:
            raise ConfigError(f"--gc-grace: {grace} must be 0 or more; use {EXAMPLES}")
        self.providers_config = providers_config
        self.data_dir = data_dir
        self.interval = interval
        self.grace = grace
        self.lock_ttl = lock_ttl
        self.lock_bucket = lock_bucket
        self._given = providers

    async def run(self, ctx: ServiceContext) -> None:
        raw = (
            dict(self._given)
            if self._given is not None
            else providers_from_config(self.providers_config, self.data_dir)
        )
        providers = instrumented(raw, ctx)
        lock = SweepLock(ctx.conn.js, ttl=self.lock_ttl, **self._bucket())
        collector = GarbageCollector(
            ctx.conn.js,
            ctx.store,
            providers,
            grace=self.grace,
            lock=lock,
            registry=ctx.metrics.registry,
        )
        log.info(
            "gc started",
            providers=sorted(providers),
            interval=self.interval,
            grace=self.grace,
            holder=lock.holder,
        )
        try:
            while True:
                try:
                    await collector.run_once()
                except Exception as exc:
                    log.warning("gc sweep failed", error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(self.interval)
        finally:
            await collector.close()
            if self._given is None:
                for provider in raw.values():
                    await provider.close()

    def _bucket(self) -> dict[str, str]:
        return {"bucket": self.lock_bucket} if self.lock_bucket else {}


def build(settings: Settings, config: GcSettings) -> GcService:
    """The factory ``run gc`` and ``up`` call; a bad providers file stops start-up here."""
    del settings
    providers = config.providers
    providers.apply()
    data_dir = providers.data_dir.resolve()
    from services.providers.config import load_providers_config  # noqa: PLC0415

    load_providers_config(providers.providers_config, default_data_dir=data_dir)
    return GcService(providers.providers_config, data_dir, config.gc_interval, config.gc_grace)
