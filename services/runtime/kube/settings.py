"""Where the cluster is, as flags and settings, without importing the Kubernetes client.

Every CLI command imports the service registry, and so the watcher's options: keeping
kubernetes_asyncio out of this module keeps it out of every command's start-up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated

import msgspec

from services.runtime.settings.errors import ConfigError
from services.runtime.settings.spec import setting


@dataclass(frozen=True, slots=True)
class KubeSettings:
    """Where the cluster is: an explicit kubeconfig (and context), or wherever we run."""

    kubeconfig: str = ""
    context: str = ""


class KubeConfigError(ConfigError):
    """The cluster cannot be reached as configured; the message names the flag and the fix."""


class KubeFlags(msgspec.Struct, frozen=True, kw_only=True):
    """The flags that say where the cluster is, part of the watcher's settings."""

    kubeconfig: Annotated[
        str,
        setting(
            "Kubeconfig file of the cluster; empty: in-cluster credentials when running in a "
            "pod, else ~/.kube/config.",
            metavar="PATH",
            show_default=False,
        ),
    ] = ""
    kube_context: Annotated[
        str,
        setting(
            "Context of the kubeconfig to use; empty: its current context.",
            metavar="NAME",
            show_default=False,
        ),
    ] = ""

    def settings(self) -> KubeSettings:
        return settings_from_flags(self.kubeconfig, self.kube_context)


def settings_from_flags(kubeconfig: str | None, kube_context: str | None) -> KubeSettings:
    """The settings from ``KubeFlags`` values (None: an unset option)."""
    # KUBECONFIG may be a list of files (path-separated); the first one is the one we load.
    path = (kubeconfig or "").split(os.pathsep)[0].strip()
    return KubeSettings(kubeconfig=path, context=(kube_context or "").strip())
