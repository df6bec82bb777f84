"""``local stop``: stop the local proxies of a data dir when no `up` runs on it.

Local proxies outlive `up` on purpose (the next `up` adopts them, docs/decisions/
0070-local-proxies-outlive-up-and.md). While `up` runs, ``delete --all`` is the way: the system
stops what it manages. Once `up` has stopped, nothing in the system is left to ask, and a pip
user has no Makefile: this command stops them, found by their pid files and checked by their
command lines, so a recycled pid never costs a stranger its life
(docs/decisions/0147-the-cli-as-one-language.md).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click
from rich.text import Text

from services.cli.common import stdout_console
from services.cli.envoptions import with_env_option
from services.cli.run.uplocal import OUTLIVING_TYPES, LocalProvider, local_providers
from services.providers.config import load_providers_config
from services.providers.local_process import PID_FILE, is_running, terminate
from services.runtime.datadir import DataDirBusy, exclusive

STOP_GRACE = 10.0
"""Seconds a proxy has to stop on SIGTERM before it is killed, as the local provider allows."""


@click.group("local")
def local() -> None:
    """The local proxies `up` leaves running on its data dir."""


@local.command("stop")
@with_env_option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".data"),
    show_default=True,
    help="The data dir `up` ran on.",
)
@with_env_option(
    "--providers-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The providers file `up` ran with, if any (where its local providers keep data).",
)
def stop(*, data_dir: Path, providers_config: Path | None) -> None:
    """Stop every local proxy `up` started on the data dir, the Squids of upstream entries
    too (refused while an `up` runs on it: use `egress-proxies delete --all` then)."""
    data_dir = data_dir.resolve()
    providers = local_providers(
        load_providers_config(providers_config, default_data_dir=data_dir), types=OUTLIVING_TYPES
    )
    if not data_dir.is_dir():
        stdout_console().print(Text(f"no data dir {data_dir}: no local proxies to stop"))
        return
    try:
        with exclusive(data_dir):
            stopped = asyncio.run(_stop_all(providers))
    except DataDirBusy as exc:
        raise click.UsageError(
            f"{exc}; while `up` runs, `egress-proxies delete --all` stops its proxies "
            "(stopping them here would only have them replaced)"
        ) from None
    console = stdout_console()
    for name in stopped:
        console.print(Text(f"stopped the local proxy {name}"))
    console.print(Text(f"{len(stopped)} local prox{'y' if len(stopped) == 1 else 'ies'} stopped"))


async def _stop_all(providers: list[LocalProvider]) -> list[str]:
    stopped: list[str] = []
    for provider in providers:
        instances = provider.data_dir / "instances"
        for path in sorted(instances.iterdir()) if instances.is_dir() else []:
            pid_file = path / PID_FILE
            text = pid_file.read_text().strip() if pid_file.is_file() else ""
            if text.isdigit() and is_running(int(text), path):
                await terminate(int(text), path, STOP_GRACE)
                stopped.append(f"{provider.name}/{path.name}")
    return stopped
