"""``crd``: print a CustomResourceDefinition the code expects, for ``kubectl apply``."""

from __future__ import annotations

import click

from services.watcher.pure.poolcrd import render_pool_yaml
from services.watcher.pure.proxycrd import render_yaml


@click.command("crd")
@click.option(
    "--kind",
    type=click.Choice(["Proxy", "ProxyPool"]),
    default="Proxy",
    show_default=True,
    help="Which resource's CRD to print.",
)
def crd(kind: str) -> None:
    """Print the Proxy (or ProxyPool) CRD (YAML), generated from the code's structs.

    \b
    Install them: egress-proxies crd | kubectl apply -f -
                  egress-proxies crd --kind ProxyPool | kubectl apply -f -
    Regenerate:   egress-proxies crd > deploy/crd/proxies.yaml
                  egress-proxies crd --kind ProxyPool > deploy/crd/proxypools.yaml
    """
    click.echo(render_pool_yaml() if kind == "ProxyPool" else render_yaml(), nl=False)
