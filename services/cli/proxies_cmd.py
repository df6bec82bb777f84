"""``apply``, ``delete`` and ``get``: proxies declared and inspected without a cluster."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import click
import msgspec
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from events.jetstream import JetStreamEventStore
from events.resource import ProxyResource, ResourceError, cli_uid
from events.schemas import Phase
from events.subjects import LEASE_STREAM, PROXY_STREAM
from projections import lease as lease_fold
from projections.lease import LeaseView
from projections.projector import Projector
from projections.proxy import ProxyView, apply
from services.cli import declare
from services.cli.common import (
    CliState,
    nats_url_option,
    open_connection,
    run_until_signalled,
    settings_for,
    stdout_console,
)
from services.cli.render import clean, format_time, inert
from services.executor.providers.config import decode_config_text, read_config_file
from services.runtime import declare as declaring
from services.runtime.config import ConfigError
from services.runtime.connection import Connection

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
        resources = declare.parse_resources(text, path, validate=validate, warn=warn)
    except ResourceError as exc:
        raise ConfigError(str(exc)) from exc
    if not resources:
        raise ConfigError(f"-f {path}: no Proxy documents in it")
    return resources


async def _projection(conn: Connection) -> Projector[ProxyView]:
    projector: Projector[ProxyView] = Projector(conn.js, PROXY_STREAM, "proxy.*.*", apply)
    await projector.catch_up()
    return projector


async def _wait(
    conn: Connection, uids: list[str], done: Done, what: str, timeout: float
) -> list[ProxyView | None]:
    """Follow the projection until every proxy is done, with a progress bar; returns the views
    of the proxies still pending when the time ran out (none: all done)."""
    projector = await _projection(conn)
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
    type=click.Choice(declare.VALIDATIONS),
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
@nats_url_option
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
@nats_url_option
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
        targets = declare.targets(_resources(filename, "ignore"))
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
                chosen = [(v.namespace, v.name, v.uid) for v in await _listed(conn, namespace)]
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


async def _listed(conn: Connection, namespace: str | None) -> list[ProxyView]:
    """The proxies ``get`` lists: declared, not removed, by namespace and name."""
    projector = await _projection(conn)
    await projector.close()
    views = [v for v in projector.views.values() if v.name and not v.removed]
    if namespace:
        views = [v for v in views if v.namespace == namespace]
    return sorted(views, key=lambda v: (v.namespace, v.name))


@dataclass(frozen=True, slots=True)
class LeaseState:
    """A proxy's lease as ``get`` shows it, at the moment of the listing."""

    lease_id: str | None = None
    holder: str = ""
    cooldown_until: datetime | None = None

    @classmethod
    def of(cls, view: LeaseView | None, now: datetime) -> LeaseState:
        if not lease_fold.is_free(view, now):
            assert view is not None
            return cls(view.lease_id, view.holder)
        rest = lease_fold.available_at(view)
        return cls(cooldown_until=rest if rest is not None and rest > now else None)

    def leased_cell(self) -> Text:
        return inert("no" if self.lease_id is None else (self.holder or "yes"))

    def cooldown_cell(self, now: datetime) -> str:
        if self.cooldown_until is None:
            return "-"
        return f"{math.ceil((self.cooldown_until - now).total_seconds())}s"


def item(view: ProxyView, lease: LeaseState) -> dict[str, object]:
    return {
        "uid": view.uid,
        "namespace": view.namespace,
        "name": view.name,
        "phase": view.phase.value,
        "reason": view.reason,
        "message": view.message,
        "ip": view.ip,
        "url": view.url,
        "provider": view.spec.provider,
        "providerID": view.provider_id,
        "healthy": view.healthy,
        "healthMessage": view.health_message,
        "attributes": dict(view.spec.attributes),
        "generation": view.generation,
        "observedGeneration": view.observed_generation,
        "conditions": msgspec.to_builtins(view.conditions),
        "leased": lease.lease_id is not None,
        "leaseId": lease.lease_id,
        "cooldownUntil": format_time(lease.cooldown_until) if lease.cooldown_until else None,
    }


def age(view: ProxyView, now: datetime) -> str:
    if view.created_at is None:
        return "-"
    seconds = int((now - view.created_at).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


Listed = list[tuple[ProxyView, LeaseState]]


def health_cell(view: ProxyView) -> str:
    return "-" if view.healthy is None else ("healthy" if view.healthy else "unhealthy")


def table(listed: Listed, now: datetime, *, wide: bool = False) -> Table:
    out = Table(box=None, pad_edge=False, header_style="bold")
    columns = ["NAMESPACE", "NAME", "PHASE", "IP", "PROVIDER", "HEALTH", "LEASED", "COOLDOWN"]
    columns += ["AGE", "UID", "MESSAGE"] if wide else ["AGE"]
    for column in columns:
        out.add_column(column, no_wrap=column != "MESSAGE", overflow="fold")
    for view, lease in listed:
        row: list[Text | str] = [
            inert(view.namespace),
            inert(view.name),
            inert(view.phase.value),
            inert(view.ip or "-"),
            inert(view.spec.provider or "-"),
            health_cell(view),
            lease.leased_cell(),
            lease.cooldown_cell(now),
            age(view, now),
        ]
        if wide:
            row += [inert(view.uid), inert(_message(view) or "-")]
        out.add_row(*row)
    return out


def _message(view: ProxyView) -> str:
    """What most explains the proxy's state: why it is unhealthy, else its phase's message."""
    if view.healthy is False and view.health_message:
        return view.health_message
    return view.message


@click.command("get")
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "wide", "json", "yaml"]),
    default="table",
    show_default=True,
    help="table for people; wide adds the UID (for `events --proxy`) and the last message "
    "(why a proxy is unhealthy or failed); json or yaml for tools.",
)
@click.option("-n", "--namespace", help="Only this namespace.")
@nats_url_option
@click.pass_obj
def get_cmd(state: CliState, *, output: str, namespace: str | None, nats_url: str | None) -> None:
    """List proxies with their phase, address, health and lease (views rebuilt from the log)."""
    settings = settings_for(state, nats_url=nats_url)

    async def work() -> tuple[list[ProxyView], dict[str, LeaseView]]:
        conn = await open_connection(settings.nats_url)
        try:
            views = await _listed(conn, namespace)
            leases: Projector[LeaseView] = Projector(
                conn.js, LEASE_STREAM, "lease.*", lease_fold.apply
            )
            await leases.catch_up()
            await leases.close()
        finally:
            await conn.close()
        return views, leases.views

    views, leases = run_until_signalled(work()) or ([], {})
    now = datetime.now(UTC)
    listed = [(v, LeaseState.of(leases.get(v.uid), now)) for v in views]
    if output == "json":
        click.echo(json.dumps({"items": [item(v, lease) for v, lease in listed]}, indent=2))
    elif output == "yaml":
        items = [item(v, lease) for v, lease in listed]
        click.echo(yaml.safe_dump({"items": items}, sort_keys=False))
    elif not listed:
        where = f" in namespace {namespace}" if namespace else ""
        stdout_console().print(inert(f"No proxies{where}."))
    else:
        stdout_console().print(table(listed, now, wide=output == "wide"))
