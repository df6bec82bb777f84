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
from services.cli.render import format_time, inert
from services.executor.providers.config import decode_config_text, read_config_file
from services.runtime import declare as declaring
from services.runtime.config import ConfigError
from services.runtime.connection import Connection

Done = Callable[[ProxyView | None], bool]


def _resources(path: str) -> list[ProxyResource]:
    """The Proxy documents of ``-f``; any file that is not a YAML file of Proxies (unreadable,
    binary, not UTF-8, not YAML, invalid, empty) is a one-line ``ConfigError`` naming it."""
    if path == "-":
        text = decode_config_text(sys.stdin.buffer.read(), "-f - (standard input)")
    else:
        text = read_config_file(Path(path), "-f")
    try:
        resources = declare.parse_resources(text, path)
    except ResourceError as exc:
        raise ConfigError(str(exc)) from exc
    if not resources:
        raise ConfigError(f"-f {path}: no Proxy documents in it")
    return resources


async def _projection(conn: Connection) -> Projector[ProxyView]:
    projector: Projector[ProxyView] = Projector(conn.js, PROXY_STREAM, "proxy.*.*", apply)
    await projector.catch_up()
    return projector


async def _wait(conn: Connection, uids: list[str], done: Done, what: str, timeout: float) -> bool:
    """Follow the projection until every proxy is done, with a progress bar; False on timeout."""
    projector = await _projection(conn)
    console = stdout_console()
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
                    finished = sum(done(projector.views.get(uid)) for uid in uids)
                    progress.update(task, completed=finished)
                    if finished == len(uids):
                        return True
                    await projector.step()
    except TimeoutError:
        return False
    finally:
        await projector.close()


def _settled(view: ProxyView | None) -> bool:
    return view is not None and view.phase in (Phase.READY, Phase.FAILED)


def _removed(view: ProxyView | None) -> bool:
    return view is None or view.removed


@click.command("apply")
@click.option(
    "-f", "--filename", required=True, help="YAML file with Proxy documents ('-': stdin)."
)
@click.option("--wait/--no-wait", default=False, help="Wait until every proxy is Ready or Failed.")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds for --wait.")
@nats_url_option
@click.pass_obj
def apply_cmd(
    state: CliState, *, filename: str, wait: bool, timeout: float, nats_url: str | None
) -> None:
    """Declare the proxies in a file; an unchanged proxy appends nothing."""
    resources = _resources(filename)
    settings = settings_for(state, nats_url=nats_url)

    async def work() -> bool:
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
                return True
            return await _wait(conn, uids, _settled, "waiting for Ready", timeout)
        finally:
            await conn.close()

    if run_until_signalled(work()) is False:
        raise click.ClickException(f"not settled within {timeout:g}s; see `egress-proxies get`")


@click.command("delete")
@click.argument("target", required=False)
@click.option("-f", "--filename", help="Delete the proxies declared in this YAML file.")
@click.option("--wait/--no-wait", default=False, help="Wait until the instances are gone.")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds for --wait.")
@nats_url_option
@click.pass_obj
def delete_cmd(
    state: CliState,
    *,
    target: str | None,
    filename: str | None,
    wait: bool,
    timeout: float,
    nats_url: str | None,
) -> None:
    """Delete proxies: NAMESPACE/NAME, or -f FILE. The instance goes first, then the proxy."""
    if (target is None) == (filename is None):
        raise click.UsageError("give either NAMESPACE/NAME or -f FILE")
    if filename is not None:
        targets = declare.targets(_resources(filename))
    else:
        assert target is not None
        namespace, sep, name = target.partition("/")
        if not sep or not namespace or not name:
            raise click.UsageError(f"{target!r}: write NAMESPACE/NAME, e.g. crawl/de-1")
        targets = [(namespace, name, cli_uid(namespace, name))]
    settings = settings_for(state, nats_url=nats_url)

    async def work() -> bool:
        conn = await open_connection(settings.nats_url)
        try:
            store = JetStreamEventStore(conn.nc, conn.js)
            console = stdout_console()
            for namespace, name, uid in targets:
                result = await declaring.delete(store, namespace, name, uid)
                console.print(inert(f"proxy {namespace}/{name} {result.result}"))
            if not wait:
                return True
            uids = [uid for _, _, uid in targets]
            return await _wait(conn, uids, _removed, "waiting for removal", timeout)
        finally:
            await conn.close()

    if run_until_signalled(work()) is False:
        raise click.ClickException(f"not removed within {timeout:g}s; see `egress-proxies get`")


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


def table(listed: Listed, now: datetime) -> Table:
    out = Table(box=None, pad_edge=False, header_style="bold")
    columns = ("NAMESPACE", "NAME", "PHASE", "IP", "PROVIDER", "HEALTH", "LEASED", "COOLDOWN")
    for column in (*columns, "AGE"):
        out.add_column(column, no_wrap=True)
    for view, lease in listed:
        health = "-" if view.healthy is None else ("healthy" if view.healthy else "unhealthy")
        out.add_row(
            inert(view.namespace),
            inert(view.name),
            inert(view.phase.value),
            inert(view.ip or "-"),
            inert(view.spec.provider or "-"),
            health,
            lease.leased_cell(),
            lease.cooldown_cell(now),
            age(view, now),
        )
    return out


@click.command("get")
@click.option("-o", "--output", type=click.Choice(["table", "json", "yaml"]), default="table")
@click.option("-n", "--namespace", help="Only this namespace.")
@nats_url_option
@click.pass_obj
def get_cmd(state: CliState, *, output: str, namespace: str | None, nats_url: str | None) -> None:
    """List proxies with their phase, address, health and lease (views rebuilt from the log)."""
    settings = settings_for(state, nats_url=nats_url)

    async def work() -> tuple[list[ProxyView], dict[str, LeaseView]]:
        conn = await open_connection(settings.nats_url)
        try:
            projector = await _projection(conn)
            await projector.close()
            leases: Projector[LeaseView] = Projector(
                conn.js, LEASE_STREAM, "lease.*", lease_fold.apply
            )
            await leases.catch_up()
            await leases.close()
        finally:
            await conn.close()
        views = [v for v in projector.views.values() if v.name and not v.removed]
        if namespace:
            views = [v for v in views if v.namespace == namespace]
        return sorted(views, key=lambda v: (v.namespace, v.name)), leases.views

    views, leases = run_until_signalled(work()) or ([], {})
    now = datetime.now(UTC)
    listed = [(v, LeaseState.of(leases.get(v.uid), now)) for v in views]
    if output == "json":
        click.echo(json.dumps({"items": [item(v, lease) for v, lease in listed]}, indent=2))
    elif output == "yaml":
        items = [item(v, lease) for v, lease in listed]
        click.echo(yaml.safe_dump({"items": items}, sort_keys=False))
    else:
        stdout_console().print(table(listed, now))
