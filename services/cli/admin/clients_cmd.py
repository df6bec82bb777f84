"""``clients``: make the token hashes of a clients file, and check a file before it is used.

The discovery API reads the file (``--clients-file``) and refuses one it cannot use at start-up;
``clients check`` says the same before a deployment, with the field and the fix named.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from services.runtime.bearer import check_token
from services.runtime.pure.clients import ClientsError, hash_token, parse_clients
from services.runtime.settings.errors import ConfigError


@click.group("clients")
def clients() -> None:
    """The discovery API's clients file (docs/api.md, "Clients")."""


@clients.command("hash")
def hash_cmd() -> None:
    """Print the `token:` value of a clients file for the token on standard input.

    \b
    openssl rand -hex 32 > crawler-a.token
    egress-proxies clients hash < crawler-a.token
    """
    token = sys.stdin.read(4096).strip()
    if not token:
        raise ConfigError("standard input: give the client's token, e.g. `clients hash < FILE`")
    check_token(token)
    if len(token) < 32:
        raise ConfigError(
            "standard input: a token of at least 32 characters, e.g. `openssl rand -hex 32`: "
            "the file keeps only its hash, which a short token does not protect"
        )
    click.echo(hash_token(token))


@clients.command("check")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def check_cmd(file: Path) -> None:
    """Check a clients file as the discovery API would read it, and list its clients."""
    try:
        table = parse_clients(file.read_bytes(), str(file))
    except ClientsError as exc:
        raise ConfigError(str(exc)) from None
    listing = Table("NAME", "SCOPES", "MAX LEASES", "SELECTORS", box=None)
    for client in sorted(table.by_hash.values(), key=lambda c: c.name):
        selectors = " | ".join(",".join(f"{k}={v}" for k, v in s.items()) for s in client.selectors)
        limit = str(client.max_leases) if client.max_leases is not None else "-"
        listing.add_row(client.name, ",".join(sorted(client.scopes)), limit, selectors or "any")
    Console(soft_wrap=True).print(listing)
