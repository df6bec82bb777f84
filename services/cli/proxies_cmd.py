"""``apply``, ``delete`` and ``get``: proxies declared and inspected without a cluster."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from events.resource import ProxyResource, ResourceError, cli_uid
from events.schemas import Phase
from projections import declaring
from projections.proxy import ProxyView
from services.cli import manifests
from services.cli.common import (
    CliState,
    open_connection,
    run_until_signalled,
    settings_for,
    settings_options,
    stdout_console,
)
from services.cli.proxyviews import listed, projection
from services.cli.render import clean, inert
from services.providers.config import decode_config_text, read_config_file
from services.runtime.connection import Connection
from services.runtime.errors import ConfigError
from services.runtime.eventlog.jetstream import JetStreamEventStore

Done = Callable[[ProxyView | None], bool]


def _resources(path: str, validate: str = "strict") -> list[ProxyResource]:
    """The Proxy documents of ``-f``; any file that is not a YAML file of Proxies (unreadable,
    binary, not UTF-8, not YAML, invalid, empty) is a one-line ``ConfigError`` naming it."""
    if path == "-":
        text = decode_config_text(sys.stdin.buffer.read(), "-f - (standard input)")
    else:
        text = read_config_file(Path(path), "-f")

    def warn(message: str) -> None:
        Console(stderr=True, highlight=False).print(inert(f"warning: {message}", "yellow"))

    try:
        resources = manifests.parse_resources(text, path, validate=validate, warn=warn)
    except ResourceError as exc:
        raise ConfigError(str(exc)) from exc
    if not resources:
        raise ConfigError(f"-f {path}: no Proxy documents in it")
    return resources


async def _wait(
    conn: Connection, uids: list[str], done: Done, what: str, timeout: float
) -> list[ProxyView | None]:
    """Follow the projection until every proxy is done, with a progress bar; returns the views
    of the proxies still pending when the time ran out (none: all done)."""
    projector = await projection(conn)
    console = stdout_console()
    pending: list[ProxyView | None] = []
    try:
        with Progress(
            TextColumn(what),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=not console.is_terminal,
        ) as progress:
            task = progress.add_task(what, total=len(uids))
            async with asyncio.timeout(timeout):
                while True:
                    pending = [
                        projector.views.get(uid)
                        for uid in uids
                        if not done(projector.views.get(uid))
                    ]
                    progress.update(task, completed=len(uids) - len(pending))
                    if not pending:
                        return []
                    await projector.step()
    except TimeoutError:
        return pending
    finally:
        await projector.close()


def _in_service(view: ProxyView | None) -> bool:
    """Ready with a first health verdict, or Failed: a proxy ``apply --wait`` returns for can
    be leased at once (or never will be without a change)."""
    if view is None:
        return False
    return view.phase is Phase.FAILED or (view.phase is Phase.READY and view.healthy is not None)


def _removed(view: ProxyView | None) -> bool:
    return view is None or view.removed


def _still(view: ProxyView | None) -> str:
    """One pending proxy, as the timeout message names it."""
    if view is None:
        return "a proxy not in the log yet"
    name = f"{view.namespace}/{view.name}"
    if view.phase is Phase.READY and view.healthy is None:
        return f"{name} (Ready, no health verdict yet)"
    if view.phase is Phase.READY and view.healthy is False:
        return f"{name} (Ready, unhealthy: {view.health_message or 'probes fail'})"
    detail = f": {view.message}" if view.message else ""
    return f"{name} ({view.phase.value}{detail})"


def _not_within(what: str, timeout: float, pending: list[ProxyView | None]) -> click.ClickException:
    names = "; ".join(clean(_still(view)) for view in pending[:5])
    more = f" and {len(pending) - 5} more" if len(pending) > 5 else ""
    return click.ClickException(
        f"{what} within {timeout:g}s: {names}{more}; see `egress-proxies get -o wide`"
    )


@click.command("apply")
@click.option(
    "-f", "--filename", required=True, help="YAML file with Proxy documents ('-': stdin)."
)
@click.option(
    "--validate",
    type=click.Choice(manifests.VALIDATIONS),
    default="strict",
    show_default=True,
    help="A field the Proxy schema does not have (a typo such as spec.atributes): refuse the "
    "file (strict), only warn, or ignore it.",
)
@click.option(
    "--wait/--no-wait",
    default=False,
    help="Wait until every proxy is Ready and has a first health verdict (or Failed).",
)
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds for --wait.")
@settings_options()
@click.pass_obj
def apply_cmd(
    state: CliState,
    *,
    filename: str,
    validate: str,
    wait: bool,
    timeout: float,
    nats_url: str | None,
) -> None:
    """Declare the proxies in a file; an unchanged proxy appends nothing."""
    resources = _resources(filename, validate)
    settings = settings_for(state, nats_url=nats_url)

    async def work() -> list[ProxyView | None]:
        conn = await open_connection(settings.nats_url)
        try:
            store = JetStreamEventStore(conn.nc, conn.js)
            console = stdout_console()
            uids = []
            for resource in resources:
                applied = await declaring.apply(store, resource)
                uids.append(applied.uid)
                console.print(inert(f"proxy {applied.namespace}/{applied.name} {applied.result}"))
            if not wait:
                return []
            return await _wait(conn, uids, _in_service, "waiting for Ready and healthy", timeout)
        finally:
            await conn.close()

    pending = run_until_signalled(work())
    if pending:
        raise _not_within("not in service", timeout, pending)


@click.command("delete")
@click.argument("target", required=False)
@click.option("-f", "--filename", help="Delete the proxies declared in this YAML file.")
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Delete every proxy (with --namespace: every proxy of that namespace).",
)
@click.option("-n", "--namespace", help="With --all: only this namespace.")
@click.option("--wait/--no-wait", default=False, help="Wait until the instances are gone.")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds for --wait.")
@settings_options()
@click.pass_obj
def delete_cmd(
    state: CliState,
    *,
    target: str | None,
    filename: str | None,
    everything: bool,
    namespace: str | None,
    wait: bool,
    timeout: float,
    nats_url: str | None,
) -> None:
    """Delete proxies: NAMESPACE/NAME, -f FILE, or --all. The instance goes first, then the
    proxy (a local proxy's Squid stops)."""
    if sum((target is not None, filename is not None, everything)) != 1:
        raise click.UsageError("give one of NAMESPACE/NAME, -f FILE or --all")
    if namespace is not None and not everything:
        raise click.UsageError("--namespace goes with --all; NAMESPACE/NAME names one proxy")
    targets: list[tuple[str, str, str]] = []
    if filename is not None:
        targets = manifests.targets(_resources(filename, "ignore"))
    elif target is not None:
        ns, sep, name = target.partition("/")
        if not sep or not ns or not name:
            raise click.UsageError(f"{target!r}: write NAMESPACE/NAME, e.g. crawl/de-1")
        targets = [(ns, name, cli_uid(ns, name))]
    settings = settings_for(state, nats_url=nats_url)

    async def work() -> list[ProxyView | None]:
        conn = await open_connection(settings.nats_url)
        try:
            store = JetStreamEventStore(conn.nc, conn.js)
            console = stdout_console()
            chosen = targets
            if everything:
                chosen = [(v.namespace, v.name, v.uid) for v in await listed(conn, namespace)]
                if not chosen:
                    console.print(Text("No proxies to delete."))
            for ns, name, uid in chosen:
                result = await declaring.delete(store, ns, name, uid)
                console.print(inert(f"proxy {ns}/{name} {result.result}"))
            if not wait or not chosen:
                return []
            uids = [uid for _, _, uid in chosen]
            return await _wait(conn, uids, _removed, "waiting for removal", timeout)
        finally:
            await conn.close()

    pending = run_until_signalled(work())
    if pending:
        raise _not_within("not removed", timeout, pending)
