"""``run watcher`` / ``up --with-watcher``: the flags and the factory.

Kept apart from ``service`` so listing the CLI's commands does not import the Kubernetes client
(about half a second); the factory imports it when the watcher is really built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from services.runtime.config import Settings
from services.runtime.errors import ConfigError
from services.runtime.kubesettings import KUBE_OPTIONS, settings_from_flags
from services.runtime.options import env_option

if TYPE_CHECKING:
    from services.watcher.service import WatcherService


def build(
    settings: Settings,
    *,
    kubeconfig: str | None = None,
    kube_context: str | None = None,
    leader_election: bool = True,
    lease_namespace: str = "default",
    lease_duration: int = 15,
    resync_seconds: float = 300.0,
) -> WatcherService:
    """The factory ``run watcher`` (and ``up --with-watcher``) calls."""
    del settings  # everything else comes from the ServiceContext
    if lease_duration < 3:
        raise ConfigError(
            f"--lease-duration: {lease_duration} is too short; use at least 3 seconds (e.g. 15)"
        )
    from services.watcher.leader import LeaderSettings  # noqa: PLC0415 - see the module doc
    from services.watcher.service import WatcherService  # noqa: PLC0415 - see the module doc

    leader = None
    if leader_election:
        # The renewal cadence follows the duration, with the library's required margins.
        leader = LeaderSettings(
            namespace=lease_namespace,
            lease_duration=lease_duration,
            renew_deadline=lease_duration * 2 / 3,
            retry_period=max(1.0, lease_duration / 7.5),
        )
    return WatcherService(
        kube=settings_from_flags(kubeconfig, kube_context),
        leader=leader,
        resync=resync_seconds,
    )


OPTIONS: tuple[click.Option, ...] = (
    *KUBE_OPTIONS,
    env_option(
        "--leader-election/--no-leader-election",
        default=True,
        show_default=True,
        help="Elect one active watcher among the replicas through a Lease; turn it off only "
        "when exactly one replica runs.",
    ),
    env_option(
        "--lease-namespace",
        env="POD_NAMESPACE",
        default="default",
        show_default=True,
        help="Namespace of the watcher's leader-election Lease.",
    ),
    env_option(
        "--lease-duration",
        type=click.IntRange(min=0),
        default=15,
        show_default=True,
        help="Seconds a standby waits for a silent leader before taking over.",
    ),
    env_option(
        "--resync-seconds",
        type=click.FloatRange(min=0),
        default=300.0,
        show_default=True,
        help="List every Proxy again this often, as a safety net under the watch; 0 never.",
    ),
)
