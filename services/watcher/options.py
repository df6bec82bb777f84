"""``run watcher`` / ``up --with-watcher``: the settings and the factory.

Kept apart from ``service`` so listing the CLI's commands does not import the Kubernetes client
(about half a second); the factory imports it when the watcher is really built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import msgspec

from services.runtime.kube.settings import KubeFlags
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import setting

if TYPE_CHECKING:
    from services.watcher.service import WatcherService

MIN_LEASE_DURATION = 3


class WatcherSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What ``run watcher`` takes (docs/decisions/0148-one-settings-struct-per-service.md)."""

    kube: KubeFlags = msgspec.field(default_factory=KubeFlags)
    leader_election: Annotated[
        bool,
        setting(
            "Elect one active watcher among the replicas through a Lease; turn it off only "
            "when exactly one replica runs.",
            off="--no-leader-election",
        ),
    ] = True
    lease_namespace: Annotated[
        str,
        setting(
            "Namespace of the watcher's leader-election Lease.",
            # The downward API sets it in a pod.
            env="POD_NAMESPACE",
        ),
    ] = "default"
    lease_duration: Annotated[
        int, setting("Seconds a standby waits for a silent leader before taking over.", ge=0)
    ] = 15
    resync_seconds: Annotated[
        float,
        setting(
            "List every Proxy again this often, as a safety net under the watch; 0 never.", ge=0
        ),
    ] = 300.0


def build(settings: Settings, config: WatcherSettings) -> WatcherService:
    """The factory ``run watcher`` (and ``up --with-watcher``) calls."""
    del settings  # everything else comes from the ServiceContext
    if config.lease_duration < MIN_LEASE_DURATION:
        raise ConfigError(
            f"--lease-duration: {config.lease_duration} is too short; use at least "
            f"{MIN_LEASE_DURATION} seconds (e.g. 15)"
        )
    from services.watcher.leader import LeaderSettings  # noqa: PLC0415 - see the module doc
    from services.watcher.service import WatcherService  # noqa: PLC0415 - see the module doc

    leader = None
    if config.leader_election:
        # The renewal cadence follows the duration, with the library's required margins.
        duration = config.lease_duration
        leader = LeaderSettings(
            namespace=config.lease_namespace,
            lease_duration=duration,
            renew_deadline=duration * 2 / 3,
            retry_period=max(1.0, duration / 7.5),
        )
    return WatcherService(kube=config.kube.settings(), leader=leader, resync=config.resync_seconds)
