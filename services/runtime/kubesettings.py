"""Where the cluster is, as flags and settings, without importing the Kubernetes client.

Every CLI command imports the service registry, and so the watcher's options: keeping
kubernetes_asyncio out of this module keeps it out of every command's start-up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import click

from services.runtime.errors import ConfigError
from services.runtime.options import env_option


@dataclass(frozen=True, slots=True)
class KubeSettings:
    """Where the cluster is: an explicit kubeconfig (and context), or wherever we run."""

    kubeconfig: str = ""
    context: str = ""


class KubeConfigError(ConfigError):
    """The cluster cannot be reached as configured; the message names the flag and the fix."""


KUBE_OPTIONS: tuple[click.Option, ...] = (
    env_option(
        "--kubeconfig",
        default="",
        metavar="PATH",
        help="Kubeconfig file of the cluster; empty: in-cluster credentials when running in a "
        "pod, else ~/.kube/config.",
    ),
    env_option(
        "--kube-context",
        default="",
        metavar="NAME",
        help="Context of the kubeconfig to use; empty: its current context.",
    ),
)


def settings_from_flags(kubeconfig: str | None, kube_context: str | None) -> KubeSettings:
    """The settings from ``KUBE_OPTIONS`` values (click passes None for an unset option)."""
    # KUBECONFIG may be a list of files (path-separated); the first one is the one we load.
    path = (kubeconfig or "").split(os.pathsep)[0].strip()
    return KubeSettings(kubeconfig=path, context=(kube_context or "").strip())
