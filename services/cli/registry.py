"""The services ``up`` and ``run NAME`` know how to start.

A service joins the command line with one ``ServiceEntry`` in ``SERVICES``: ``run NAME`` gets a
sub-command with the entry's options, ``up`` gets the same options (once each, however many
services share one) and passes every service the flags it declares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import click

from services.discovery import service as discovery
from services.executor import service as executor
from services.gc import service as gc
from services.health import service as health
from services.pools import service as pools
from services.reconciler import service as reconciler
from services.runtime.service import Service
from services.watcher import options as watcher

ServiceFactory = Callable[..., Service]
"""``factory(settings, **flags) -> Service``; ``flags`` are the values of the entry's options,
keyed by their parameter names. Validation that needs no server (a providers file that does not
parse) belongs here, so it fails before anything starts."""


@dataclass(frozen=True, slots=True)
class ServiceEntry:
    name: str
    help: str
    factory: ServiceFactory
    options: tuple[click.Option, ...] = ()
    up_names: Mapping[str, str] = field(default_factory=dict)
    """Flags this service takes from an option of ``up`` with another name, e.g. discovery's
    ``port`` is ``up --api-port``: one command running everything needs names that say whose
    port it is."""

    up_optional: bool = False
    """``up`` runs this service only with ``--with-NAME`` (one that needs something the demo
    lacks, e.g. the watcher needs a cluster)."""

    def up_name(self, param: str) -> str:
        return self.up_names.get(param, param)


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
        reconciler.OPTIONS,
    ),
    ServiceEntry(
        "executor",
        "Run the reconciler's commands against the providers; report what instances do.",
        executor.build,
        executor.OPTIONS,
    ),
    ServiceEntry(
        "discovery",
        "Serve the discovery API: list proxies, lease them out, record outcomes.",
        discovery.build,
        discovery.OPTIONS,
        up_names={"port": "api_port"},
    ),
    ServiceEntry(
        "gc",
        "Delete orphaned instances: tagged as ours, proxy removed, older than the grace.",
        gc.build,
        gc.OPTIONS,
    ),
    ServiceEntry(
        "health",
        "Probe every Ready proxy through itself; record health transitions.",
        health.build,
        health.OPTIONS,
    ),
    ServiceEntry(
        "pools",
        "Keep every ProxyPool's members as many, where and as fresh as it asks.",
        pools.build,
        pools.OPTIONS,
    ),
    ServiceEntry(
        "watcher",
        "Watch Proxy custom resources into the event log; write their status back.",
        watcher.build,
        watcher.OPTIONS,
        up_optional=True,
    ),
)


def known_names() -> str:
    return ", ".join(sorted(SERVICES)) or "none yet (no service is installed in this build)"


def option_names(entry: ServiceEntry) -> list[str]:
    # An option that does not expose its value (it acts in a callback) is no factory flag.
    return [opt.name for opt in entry.options if opt.name and opt.expose_value]
