"""``crd``: print the Proxy CustomResourceDefinition the code expects, for ``kubectl apply``."""

from __future__ import annotations

import click

from services.watcher.pure.crd import render_yaml


@click.command("crd")
def crd() -> None:
    """Print the Proxy CRD (YAML), generated from the code's structs.

    \b
    Install it:   egress-proxies crd | kubectl apply -f -
    Regenerate:   egress-proxies crd > deploy/crd/proxies.yaml
    """
    click.echo(render_yaml(), nl=False)
