"""The watcher's flags: what `run watcher` builds, and the mistakes refused at start-up."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.leaderelection import electionconfig

from services.runtime.kube.settings import KubeFlags
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import Settings
from services.watcher.options import WatcherSettings, build


def test_defaults_elect_a_leader_with_the_library_margins() -> None:
    service = build(
        Settings(), WatcherSettings(kube=KubeFlags(kubeconfig="/k/config", kube_context="ctx"))
    )
    assert service.kube.kubeconfig == "/k/config"
    assert service.kube.context == "ctx"
    leader = service.leader
    assert leader is not None
    assert isinstance(leader.lease_duration, int)
    for duration in (3, 15, 60):
        leader = build(Settings(), WatcherSettings(lease_duration=duration)).leader
        assert leader is not None
        # The library refuses margins it cannot work with; these must pass its checks.
        electionconfig.Config(
            object(),  # type: ignore[arg-type]  # the lock is not used by the checks
            leader.lease_duration,
            leader.renew_deadline,
            leader.retry_period,
            lambda: None,  # type: ignore[arg-type,return-value]  # never called
            None,  # type: ignore[arg-type]  # optional in practice
        )


def test_no_election_and_a_too_short_lease_is_refused() -> None:
    assert build(Settings(), WatcherSettings(leader_election=False)).leader is None
    with pytest.raises(ConfigError, match="--lease-duration"):
        build(Settings(), WatcherSettings(lease_duration=2))
