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
    NotDone,
    open_connection,
    run_until_signalled,
    settings_for,
    settings_options,
    stdout_console,
)
from services.cli.known_providers import SETTLE_SECONDS, known_providers
from services.cli.proxyviews import listed, projection
from services.cli.pure.render import clean, inert
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


def _all_resources(paths: tuple[str, ...], validate: str) -> list[ProxyResource]:
    """Every file's Proxies, in the order given; one bad file refuses them all (as one bad
    document refuses its file, ``manifests.parse_resources``)."""
    if paths.count("-") > 1:
        raise ConfigError("-f -: standard input can be read once; give it one -f")
    return [r for path in paths for r in _resources(path, validate)]


async def _provider_refusal(conn: Connection, resources: list[ProxyResource]) -> str | None:
    """Why a ``spec.provider`` is not one the running system has, or None (also when it cannot
    tell). A refusal is read twice, ``SETTLE_SECONDS`` apart: the first read may have fallen
    between two providers' summaries of one sweep
    (docs/decisions/0098-commands-tell-the-truth-exit.md)."""
    refused = None
    for attempt in range(2):
        if attempt:
            await asyncio.sleep(SETTLE_SECONDS)
        known = await known_providers(conn.js)
        if known is None:
            return None
        refused = manifests.unknown_providers(resources, known.names, known.sweep_id)
        if refused is None:
            return None
    return refused


async def _wait(
    conn: Connection, uids: list[str], done: Done, what: str, timeout: float
) -> list[ProxyView | None]:
    """Follow the projection until every proxy is done or the time ran out, with a progress
    bar; returns every proxy's view as it was then (in ``uids`` order), for the caller to say
    which are not done and why."""
    projector = await projection(conn)
    console = stdout_console()

    def views() -> list[ProxyView | None]:
        return [projector.views.get(uid) for uid in uids]

    try:
        with Progress(
            TextColumn(what),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            # A bar is for a person: into a pipe or a file it would print a blank line.
            disable=not console.is_terminal,
        ) as progress:
            task = progress.add_task(what, total=len(uids))
            async with asyncio.timeout(timeout):
                while True:
                    finished = sum(1 for view in views() if done(view))
                    progress.update(task, completed=finished)
                    if finished == len(uids):
                        break
                    await projector.step()
    except TimeoutError:
        pass
    finally:
        await projector.close()
    return views()


def _in_service(view: ProxyView | None) -> bool:
    """Ready and probed healthy (it can be leased at once), or Failed (it never will be without
    a change, so waiting longer is pointless). An unhealthy proxy is waited for: the prober
    probes it again and the reconciler replaces one that stays unhealthy."""
    if view is None:
        return False
    return view.phase is Phase.FAILED or (view.phase is Phase.READY and view.healthy is True)


def _failed(view: ProxyView | None) -> bool:
    return view is not None and view.phase is Phase.FAILED


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


def _named(views: list[ProxyView | None]) -> str:
    names = "; ".join(clean(_still(view)) for view in views[:5])
    return names + (f" and {len(views) - 5} more" if len(views) > 5 else "")


def _not_within(what: str, timeout: float, pending: list[ProxyView | None]) -> NotDone:
    return NotDone(
        f"{what} within {timeout:g}s: {_named(pending)}; see `egress-proxies get -o wide`"
    )


def _not_in_service(timeout: float, views: list[ProxyView | None]) -> NotDone | None:
    """Why ``apply --wait`` did not end with every proxy Ready and healthy, or None if it did;
    a Failed proxy is named with its reason (e.g. ``create: unknown provider 'gcp-eu'``)."""
    failed = [view for view in views if _failed(view)]
    if failed:
        return NotDone(f"failed: {_named(failed)}; fix the Proxy (or the provider) and apply again")
    pending = [view for view in views if not _in_service(view)]
    return _not_within("not Ready and healthy", timeout, pending) if pending else None


@click.command("apply")
@click.option(
    "-f",
    "--filename",
    "filenames",
    required=True,
    multiple=True,
    help="YAML file with Proxy documents ('-': stdin); repeat for more (all are applied, or "
    "none when one is invalid).",
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
    help="Wait until every proxy is Ready and probed healthy; exit 10 as soon as one is "
    "Failed, or when one is not Ready and healthy within --timeout.",
)
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds for --wait.")
@click.option(
    "--provider-check/--no-provider-check",
    default=True,
    help="Refuse a spec.provider that the running system does not have (the providers of its "
    "last GC sweep; without one in the log nothing is checked).",
)
@settings_options()
@click.pass_obj
def apply_cmd(
    state: CliState,
    *,
    filenames: tuple[str, ...],
    validate: str,
    wait: bool,
    timeout: float,
    provider_check: bool,
    nats_url: str | None,
) -> None:
    """Declare the proxies in files; an unchanged proxy appends nothing."""
    resources = _all_resources(filenames, validate)
    settings = settings_for(state, nats_url=nats_url)

    async def work() -> list[ProxyView | None] | None:
        conn = await open_connection(settings.nats_url)
        try:
            refused = await _provider_refusal(conn, resources) if provider_check else None
            if refused is not None:
                raise ConfigError(refused)
            store = JetStreamEventStore(conn.nc, conn.js)
            console = stdout_console()
            uids = []
            for resource in resources:
                applied = await declaring.apply(store, resource)
                uids.append(applied.uid)
                console.print(inert(f"proxy {applied.namespace}/{applied.name} {applied.result}"))
            if not wait:
                return None
            return await _wait(conn, uids, _in_service, "waiting for Ready and healthy", timeout)
        finally:
            await conn.close()

    views = run_until_signalled(work())
    problem = _not_in_service(timeout, views) if views is not None else None
    if problem is not None:
        raise problem


@click.command("delete")
@click.argument("target", required=False)
@click.option(
    "-f",
    "--filename",
    "filenames",
    multiple=True,
    help="Delete the proxies declared in this YAML file; repeat for more.",
)
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
    filenames: tuple[str, ...],
    everything: bool,
    namespace: str | None,
    wait: bool,
    timeout: float,
    nats_url: str | None,
) -> None:
    """Delete proxies: NAMESPACE/NAME, -f FILE, or --all. The instance goes first, then the
    proxy (a local proxy's Squid stops)."""
    if sum((target is not None, bool(filenames), everything)) != 1:
        raise click.UsageError("give one of NAMESPACE/NAME, -f FILE or --all")
    if namespace is not None and not everything:
        raise click.UsageError("--namespace goes with --all; NAMESPACE/NAME names one proxy")
    targets: list[tuple[str, str, str]] = []
    if filenames:
        targets = manifests.targets(_all_resources(filenames, "ignore"))
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
            views = await _wait(conn, uids, _removed, "waiting for removal", timeout)
            return [view for view in views if not _removed(view)]
        finally:
            await conn.close()

    pending = run_until_signalled(work())
    if pending:
        raise _not_within("not removed", timeout, pending)
