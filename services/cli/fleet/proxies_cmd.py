"""``apply`` and ``delete``: proxies (and pools, ``pools_cmd``) declared without a cluster."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from commands import declaring, pooldeclaring
from events.customresource import ResourceError, cli_uid
from events.schemas import Phase
from projections.proxy import ProxyView
from services.cli.common import (
    CliState,
    NotDone,
    open_connection,
    run_until_signalled,
    settings_for,
    settings_options,
    stdout_console,
)
from services.cli.fleet import manifests, pools_cmd
from services.cli.fleet.known_providers import SETTLE_SECONDS, known_providers
from services.cli.fleet.proxyviews import listed, projection
from services.cli.pure.render import clean, inert
from services.providers.config import decode_config_text, read_config_file
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.settings.errors import ConfigError

Done = Callable[[ProxyView | None], bool]


def _resources(path: str, validate: str = "strict") -> list[manifests.Document]:
    """The Proxy and ProxyPool documents of ``-f``; any file that is not a YAML file of them
    (unreadable, binary, not UTF-8, not YAML, invalid, empty) is a one-line ``ConfigError``
    naming it."""
    if path == "-":
        text = decode_config_text(sys.stdin.buffer.read(), "-f - (standard input)")
    else:
        text = read_config_file(Path(path), "-f")

    def warn(message: str) -> None:
        Console(stderr=True, highlight=False).print(inert(f"warning: {message}", "yellow"))

    try:
        resources = manifests.parse_documents(text, path, validate=validate, warn=warn)
    except ResourceError as exc:
        raise ConfigError(str(exc)) from exc
    if not resources:
        raise ConfigError(f"-f {path}: no Proxy documents in it, nor ProxyPool ones")
    return resources


def _all_resources(paths: tuple[str, ...], validate: str) -> list[manifests.Document]:
    """Every file's Proxies and pools, in the order given; one bad file refuses them all (as one
    bad document refuses its file, ``manifests.parse_documents``)."""
    if paths.count("-") > 1:
        raise ConfigError("-f -: standard input can be read once; give it one -f")
    found: list[manifests.Document] = []
    # Every file's problems, not only the first bad file's: one run shows all there is to fix.
    problems: list[str] = []
    for path in paths:
        try:
            found += _resources(path, validate)
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("; ".join(problems))
    return found


async def _provider_refusal(conn: Connection, resources: list[manifests.Document]) -> str | None:
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
    help="YAML file with Proxy and ProxyPool documents ('-': stdin); repeat for more (all are "
    "applied, or none when one is invalid).",
)
@click.option(
    "--validate",
    type=click.Choice(manifests.VALIDATIONS),
    default="strict",
    show_default=True,
    help="A field the Proxy or ProxyPool schema does not have (a typo such as "
    "spec.atributes): refuse the file (strict), only warn, or ignore it.",
)
@click.option(
    "--wait/--no-wait",
    default=False,
    help="Wait until every proxy is Ready and probed healthy (and every pool has its members "
    "so); exit 10 as soon as a proxy is Failed, or when one is not Ready and healthy within "
    "--timeout.",
)
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds for --wait.")
@click.option(
    "--provider-check/--no-provider-check",
    default=True,
    help="Refuse a spec.provider (a pool's template provider or spread) that the running "
    "system does not have (the providers of its last GC sweep; without one in the log nothing "
    "is checked).",
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
    """Declare the proxies and pools in files; an unchanged one appends nothing."""
    resources = _all_resources(filenames, validate)
    settings = settings_for(state, nats_url=nats_url)

    async def work() -> NotDone | None:
        conn = await open_connection(settings.nats_url)
        try:
            refused = await _provider_refusal(conn, resources) if provider_check else None
            if refused is not None:
                raise ConfigError(refused)
            store = JetStreamEventStore(conn.nc, conn.js)
            console = stdout_console()
            uids = []
            pools: list[tuple[str, str]] = []
            for resource in resources:
                if isinstance(resource, manifests.PoolDocument):
                    ns, name = resource.namespace, resource.name
                    applied = await pooldeclaring.apply_pool(store, ns, name, resource.spec)
                    pools.append((ns, name))
                    console.print(inert(f"proxypool {ns}/{name} {applied.result}"))
                    continue
                try:
                    applied = await declaring.apply(store, resource)
                except declaring.OwnedByPool as exc:
                    # The pool would put it back: two spec changes, and nothing gained.
                    raise ConfigError(f"{exc}; nothing was changed for it") from None
                uids.append(applied.uid)
                console.print(inert(f"proxy {applied.namespace}/{applied.name} {applied.result}"))
            if not wait:
                return None
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            if uids:
                views = await _wait(
                    conn, uids, _in_service, "waiting for Ready and healthy", timeout
                )
                problem = _not_in_service(timeout, views)
                if problem is not None or not pools:
                    return problem
            left = max(deadline - loop.time(), 0.0)
            return await pools_cmd.wait_in_service(conn, pools, left, timeout)
        finally:
            await conn.close()

    problem = run_until_signalled(work())
    if isinstance(problem, NotDone):
        raise problem


def _delete_targets(
    target: str | None, filenames: tuple[str, ...], *, everything: bool, namespace: str | None
) -> tuple[list[tuple[str, str, str]], list[manifests.PoolDocument]]:
    """The proxies (namespace, name, uid) and the pools ``delete`` names, before ``--all``."""
    if sum((target is not None, bool(filenames), everything)) != 1:
        raise click.UsageError("give one of NAMESPACE/NAME, -f FILE, --all or pool NAME")
    if namespace is not None and not everything:
        raise click.UsageError(
            "--namespace goes with --all or pool NAME; NAMESPACE/NAME names one proxy"
        )
    if filenames:
        documents = _all_resources(filenames, "ignore")
        return manifests.targets(documents), manifests.pools(documents)
    if target is not None:
        ns, sep, name = target.partition("/")
        if not sep or not ns or not name:
            raise click.UsageError(f"{target!r}: write NAMESPACE/NAME, e.g. crawl/de-1")
        return [(ns, name, cli_uid(ns, name))], []
    return [], []


@click.command("delete")
@click.argument("target", required=False)
@click.argument("pool_name", metavar="[NAME]", required=False)
@click.option(
    "-f",
    "--filename",
    "filenames",
    multiple=True,
    help="Delete the proxies (and pools) declared in this YAML file; repeat for more.",
)
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Delete every proxy and pool (with --namespace: those of that namespace).",
)
@click.option(
    "-n",
    "--namespace",
    help="With --all: only this namespace. With pool NAME: the pool's (default: default).",
)
@click.option("--wait/--no-wait", default=False, help="Wait until the instances are gone.")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds for --wait.")
@settings_options()
@click.pass_obj
def delete_cmd(
    state: CliState,
    *,
    target: str | None,
    pool_name: str | None,
    filenames: tuple[str, ...],
    everything: bool,
    namespace: str | None,
    wait: bool,
    timeout: float,
    nats_url: str | None,
) -> None:
    """Delete proxies: NAMESPACE/NAME, -f FILE, or --all. The instance goes first, then the
    proxy (a local proxy's Squid stops). `delete pool [NS/]NAME [-n NS]` deletes a pool: its
    members go first, then the pool."""
    if target is not None and pools_cmd.pool_kind(target):
        if pool_name is None or filenames or everything:
            raise click.UsageError(
                "write `delete pool [NAMESPACE/]NAME [-n NAMESPACE]`, e.g. delete pool crawl/de"
            )
        pool_namespace, name = pools_cmd.resolve(pool_name, namespace)
        pools_cmd.delete_pool(
            state,
            name=name,
            namespace=pool_namespace,
            wait=wait,
            timeout=timeout,
            nats_url=nats_url,
        )
        return
    if pool_name is not None:
        raise click.UsageError(f"{pool_name!r}: give one NAMESPACE/NAME (or `pool NAME`)")
    targets, pools = _delete_targets(target, filenames, everything=everything, namespace=namespace)
    settings = settings_for(state, nats_url=nats_url)

    async def work() -> tuple[list[ProxyView | None], str]:
        conn = await open_connection(settings.nats_url)
        try:
            store = JetStreamEventStore(conn.nc, conn.js)
            console = stdout_console()
            chosen, doomed = targets, [(p.namespace, p.name) for p in pools]
            if everything:
                chosen = [(v.namespace, v.name, v.uid) for v in await listed(conn, namespace)]
                # Their pools too: a member deleted alone is declared again by its pool.
                doomed = await pools_cmd.listed(conn, namespace)
                if not chosen and not doomed:
                    console.print(Text("No proxies to delete."))
            for ns, name, uid in chosen:
                result = await declaring.delete(store, ns, name, uid)
                console.print(inert(f"proxy {ns}/{name} {result.result}"))
            for ns, name in doomed:
                result = await pooldeclaring.delete_pool(store, ns, name)
                console.print(inert(f"proxypool {ns}/{name} {result.result}"))
            if not wait:
                return [], ""
            deadline = asyncio.get_running_loop().time() + timeout
            views: list[ProxyView | None] = []
            if chosen:
                uids = [uid for _, _, uid in chosen]
                views = await _wait(conn, uids, _removed, "waiting for removal", timeout)
                views = [view for view in views if not _removed(view)]
            left = max(deadline - asyncio.get_running_loop().time(), 0.0)
            if views or not doomed:
                return views, ""
            return [], await pools_cmd.wait_removed(conn, doomed, left)
        finally:
            await conn.close()

    pending, pools_left = run_until_signalled(work()) or ([], "")
    if pending:
        raise _not_within("not removed", timeout, pending)
    if pools_left:
        raise NotDone(f"not removed within {timeout:g}s: {pools_left}")
