"""The services ``up`` and ``run NAME`` know how to start.

A service joins the command line with one ``ServiceEntry`` in ``SERVICES``: ``run NAME`` gets a
sub-command with the options generated from the entry's settings Struct (``services.cli.flags``),
``up`` gets the same options (once each, however many services share one) and builds every
service's Struct from them (docs/decisions/0148-one-settings-struct-per-service.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import click
import msgspec

from services.cli.envoptions import EnvSetting
from services.cli.flags import options
from services.discovery import service as discovery
from services.executor import service as executor
from services.gateway import service as gateway
from services.gc import service as gc
from services.health import service as health
from services.pools import service as pools
from services.reconciler import service as reconciler
from services.runtime.service import Service
from services.runtime.settings.spec import setting_fields
from services.watcher import options as watcher

ServiceFactory = Callable[[Any, Any], Service]
"""``factory(settings, config) -> Service``; ``config`` is the entry's settings Struct, built from
the command line. Validation that needs no server (a providers file that does not parse)
belongs here, so it fails before anything starts."""


@dataclass(frozen=True, slots=True)
class ServiceEntry:
    name: str
    help: str
    factory: ServiceFactory
    settings: type[msgspec.Struct]
    up_names: Mapping[str, str] = field(default_factory=dict)
    """Flags this service takes from an option of ``up`` with another name, e.g. discovery's
    ``port`` is ``up --api-port``: one command running everything needs names that say whose
    port it is."""

    up_optional: bool = False
    """``up`` runs this service only with ``--with-NAME`` (one that needs something the demo
    lacks, e.g. the watcher needs a cluster)."""

    def up_name(self, param: str) -> str:
        return self.up_names.get(param, param)

    @property
    def options(self) -> tuple[click.Option, ...]:
        """The options of its settings, then the variables it reads itself (``reads_env``)."""
        reads: tuple[str, ...] = getattr(self.settings, "reads_env", ())
        secrets = (EnvSetting([v.lower()], default=None, callback=None) for v in reads)
        return (*secrets, *options(self.settings))


def entries(*found: ServiceEntry) -> dict[str, ServiceEntry]:
    """Index entries by name, refusing two with one name (the second would silently win)."""
    by_name: dict[str, ServiceEntry] = {}
    for entry in found:
        if entry.name in by_name:
            raise ValueError(f"service {entry.name!r} is registered twice")
        by_name[entry.name] = entry
    return by_name


SERVICES: dict[str, ServiceEntry] = entries(
    # One line per service (health, gc, discovery, watcher join as they are built).
    ServiceEntry(
        "reconciler",
        "Decide, per proxy, the commands and phase changes its events call for.",
        reconciler.build,
        reconciler.ReconcilerSettings,
    ),
    ServiceEntry(
        "executor",
        "Run the reconciler's commands against the providers; report what instances do.",
        executor.build,
        executor.ExecutorSettings,
    ),
    ServiceEntry(
        "discovery",
        "Serve the discovery API: list proxies, lease them out, record outcomes.",
        discovery.build,
        discovery.DiscoverySettings,
        up_names={"port": "api_port"},
    ),
    ServiceEntry(
        "gc",
        "Delete orphaned instances: tagged as ours, proxy removed, older than the grace.",
        gc.build,
        gc.GcSettings,
    ),
    ServiceEntry(
        "health",
        "Probe every Ready proxy through itself; record health transitions.",
        health.build,
        health.HealthSettings,
    ),
    ServiceEntry(
        "pools",
        "Keep every ProxyPool's members as many, where and as fresh as it asks.",
        pools.build,
        pools.PoolsSettings,
    ),
    ServiceEntry(
        "gateway",
        "Serve one proxy endpoint for the whole fleet: lease, relay, report (docs/gateway.md).",
        gateway.build,
        gateway.GatewaySettings,
    ),
    ServiceEntry(
        "watcher",
        "Watch Proxy custom resources into the event log; write their status back.",
        watcher.build,
        watcher.WatcherSettings,
        up_optional=True,
    ),
)


def known_names() -> str:
    return ", ".join(sorted(SERVICES)) or "none yet (no service is installed in this build)"


def option_names(entry: ServiceEntry) -> list[str]:
    """The parameter names of its settings, which are its Struct's field names."""
    return [f.name for f in setting_fields(entry.settings)]
