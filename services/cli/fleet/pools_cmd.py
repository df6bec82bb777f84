"""Pools from the command line: ``get pools``, ``describe pool``, ``scale pool``, ``delete pool``
(docs/architecture.md, "Pools"). A pool is declared with ``apply -f`` like a Proxy
(``manifests.parse_documents``); its members are Proxies with the attribute ``pool=<name>``, so
``get -l pool=NAME`` lists them."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import click
import yaml

from commands import pooldeclaring
from events.pool import MAX_REPLICAS
from events.poolresource import MAX_POOL_NAME
from services.cli.common import (
    CliState,
    NotDone,
    open_connection,
    print_trimmed,
    run_until_signalled,
    settings_for,
    settings_options,
    stdout_console,
)
from services.cli.fleet import poolviews
from services.cli.pure.pool_render import (
    Decided,
    PoolRow,
    describe,
    pool_item,
    pool_row,
    pools_table,
)
from services.cli.pure.render import clean, format_time, inert, json_text
from services.discovery.pure.pools import unknown_pool_hint
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.pure.poolref import PoolRef
from services.runtime.settings.errors import ConfigError

DEFAULT_NAMESPACE = "default"
"""A pool's namespace when neither the manifest nor ``-n`` names one (as ``metadata``'s)."""
POOL_KINDS = ("pool", "pools", "proxypool", "proxypools", "ppl")
"""What ``get``, ``describe``, ``scale`` and ``delete`` accept for a pool, as kubectl does."""
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


def check_name(name: str, what: str = "NAME") -> str:
    """A pool's name as ``apply`` accepts it: a longer one could never name a pool, so it is
    refused rather than reported absent."""
    if not _DNS_LABEL.match(name) or len(name) > MAX_POOL_NAME:
        raise click.BadParameter(
            f"{clean(name)!r}: a pool's name is 1-{MAX_POOL_NAME} lowercase letters, digits or "
            "'-' (its members add 6), e.g. de",
            param_hint=what,
        )
    return name


def check_namespace(namespace: str) -> str:
    if not _DNS_LABEL.match(namespace):
        raise click.BadParameter(
            f"{clean(namespace)!r}: use 1-63 lowercase letters, digits or '-'",
            param_hint="'-n' / '--namespace'",
        )
    return namespace


def _name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``NAMESPACE/NAME`` or ``NAME``, as a proxy is named (``crawl/de-1``); the namespace part
    is checked here and joined with ``-n`` by ``resolve``."""
    del ctx, param
    namespace, slash, name = value.rpartition("/")
    if slash:
        check_namespace(namespace)
    check_name(name)
    return value


def resolve(ref: str, namespace: str | None) -> tuple[str, str]:
    """One rule for every command (docs/decisions/0147-the-cli-as-one-language.md): a pool is
    ``NAMESPACE/NAME`` or ``NAME`` with ``-n NAMESPACE`` (default: default); both naming
    different namespaces is refused rather than one silently winning."""
    given, slash, name = ref.rpartition("/")
    if not slash:
        return namespace or DEFAULT_NAMESPACE, name
    if namespace is not None and namespace != given:
        raise click.UsageError(
            f"{clean(ref)!r} names the namespace {given!r} and -n names {namespace!r}; "
            "give one of them"
        )
    return given, name


def _namespace(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    del ctx, param
    return None if value is None else check_namespace(value)


namespace_option = click.option(
    "-n",
    "--namespace",
    default=None,
    callback=_namespace,
    help=f"The pool's namespace, if NAME has none (default: {DEFAULT_NAMESPACE}).",
)


def show_pools(
    state: CliState,
    *,
    output: str,
    namespace: str | None,
    at: datetime | None,
    nats_url: str | None,
) -> None:
    """``get pools``: a row per pool, its members' figures judged as its controller judges them."""
    settings = settings_for(state, nats_url=nats_url)

    async def work() -> poolviews.Fleet:
        conn = await open_connection(settings.nats_url)
        try:
            return await poolviews.fleet(conn, at)
        finally:
            await conn.close()

    fleet = run_until_signalled(work())
    now = at or datetime.now(UTC)
    rows = fleet.rows(namespace, now) if fleet is not None else []
    if output in ("json", "yaml"):
        items = {"items": [pool_item(row) for row in rows]}
        if output == "json":
            click.echo(json_text(items, indent=2))
        else:
            click.echo(yaml.safe_dump(items, sort_keys=False))
    elif not rows:
        where = f" in namespace {namespace}" if namespace else ""
        where += f" at {format_time(at)}" if at else ""
        stdout_console().print(inert(f"No pools{where}."))
    else:
        stdout_console().print(pools_table(rows, now, wide=output == "wide"))


@click.group("describe")
def describe_cmd() -> None:
    """Show one pool in detail: its spec, its members and why it did what it did."""


@describe_cmd.command("pool")
@click.argument("name", metavar="[NAMESPACE/]NAME", callback=_name)
@namespace_option
@settings_options()
@click.pass_obj
def describe_pool(
    state: CliState, *, name: str, namespace: str | None, nats_url: str | None
) -> None:
    """A pool's spec, each member with its phase, readiness and lease, and its last decisions
    with the figures its controller saw."""
    namespace, name = resolve(name, namespace)
    settings = settings_for(state, nats_url=nats_url)

    async def work() -> tuple[PoolRow | None, list[Decided], str]:
        conn = await open_connection(settings.nats_url)
        try:
            view, decisions = await poolviews.history(conn, namespace, name)
            fleet = await poolviews.fleet(conn)
        finally:
            await conn.close()
        if view is None or view.removed:
            return None, [], _absent(namespace, name, fleet)
        # The aggregate just read, not the projection: it is at least as new.
        now = datetime.now(UTC)
        return pool_row(view, fleet.proxies, fleet.leases, now), decisions, ""

    row, decisions, absent = run_until_signalled(work()) or (None, [], "")
    if row is None:
        if absent:
            raise ConfigError(absent)
        return
    print_trimmed(describe(row, decisions, datetime.now(UTC)))


def _absent(namespace: str, name: str, fleet: poolviews.Fleet) -> str:
    """The discovery API's 404 in the CLI's words: the pools of that name elsewhere, else the
    pools there are (``services.discovery.pure.pools.unknown_pool_hint``)."""
    known = [PoolRef(v.namespace, v.name) for v in fleet.pools.values() if v.name and not v.removed]
    hint = unknown_pool_hint(PoolRef(namespace, name), known)
    return clean(f"proxypool {namespace}/{name}: no such pool; {hint}")


@click.group("scale")
def scale_cmd() -> None:
    """Change how many members a pool asks for."""


@scale_cmd.command("pool")
@click.argument("name", metavar="[NAMESPACE/]NAME", callback=_name)
@click.option(
    "--replicas",
    required=True,
    type=click.IntRange(0, MAX_REPLICAS),
    help=f"Members the pool asks for, 0 to {MAX_REPLICAS}; a later `apply` of a changed "
    "spec.replicas sets it again.",
)
@namespace_option
@settings_options()
@click.pass_obj
def scale_pool(
    state: CliState, *, name: str, replicas: int, namespace: str | None, nats_url: str | None
) -> None:
    """Ask a pool for REPLICAS members; its controller adds or retires them (never a leased
    one: a member in use is retired once its lease ends)."""
    namespace, name = resolve(name, namespace)
    settings = settings_for(state, nats_url=nats_url)

    async def work() -> tuple[str, str]:
        conn = await open_connection(settings.nats_url)
        try:
            store = JetStreamEventStore(conn.nc, conn.js)
            result = (await pooldeclaring.scale_pool(store, namespace, name, replicas)).result
            if result == "absent":
                return result, _absent(namespace, name, await poolviews.fleet(conn))
            return result, ""
        finally:
            await conn.close()

    result, absent = run_until_signalled(work()) or (None, "")
    if absent:
        raise ConfigError(absent)
    if result == "deleting":
        raise ConfigError(f"proxypool {namespace}/{name} is being deleted; it cannot be scaled")
    if result is not None:
        stdout_console().print(inert(f"proxypool {namespace}/{name} {result}"))


def delete_pool(
    state: CliState,
    *,
    name: str,
    namespace: str,
    wait: bool,
    timeout: float,
    nats_url: str | None,
) -> None:
    """``delete pool NAME``: its controller retires every member, then removes the pool."""
    check_name(name)
    check_namespace(namespace)
    settings = settings_for(state, nats_url=nats_url)

    async def work() -> str:
        conn = await open_connection(settings.nats_url)
        try:
            store = JetStreamEventStore(conn.nc, conn.js)
            applied = await pooldeclaring.delete_pool(store, namespace, name)
            stdout_console().print(inert(f"proxypool {namespace}/{name} {applied.result}"))
            if not wait or applied.result == "absent":
                return ""
            return await wait_removed(conn, [(namespace, name)], timeout)
        finally:
            await conn.close()

    pending = run_until_signalled(work())
    if pending:
        raise NotDone(f"not removed within {timeout:g}s: {pending}")


async def wait_removed(conn: Connection, keys: list[tuple[str, str]], timeout: float) -> str:
    """``delete --wait`` for pools: "" once each is removed, else which are not and why."""
    rows = await poolviews.wait_for(conn, keys, _removed, _removal_label, timeout)
    pending = [row for row in rows if row is not None]
    if not pending:
        return ""
    return (
        f"{_pending(pending)}; is the pool controller running (`run pools`, or `up`)? See "
        "`egress-proxies describe pool NAME -n NAMESPACE`"
    )


async def listed(conn: Connection, namespace: str | None) -> list[tuple[str, str]]:
    """The pools ``delete --all`` deletes: declared, not removed (in ``namespace``)."""
    fleet = await poolviews.fleet(conn)
    views = [v for v in fleet.pools.values() if v.name and not v.removed]
    return sorted((v.namespace, v.name) for v in views if not namespace or v.namespace == namespace)


def _removed(row: PoolRow | None) -> bool:
    return row is None


def _removal_label(rows: list[PoolRow | None]) -> str:
    left = sum(len(row.members) for row in rows if row is not None)
    return f"waiting for removal ({left} members left)"


def _pending(rows: list[PoolRow]) -> str:
    def one(row: PoolRow) -> str:
        seen = row.figures
        name = f"proxypool {row.view.namespace}/{row.view.name}"
        return (
            f"{name} ({seen.healthy} of {seen.desired} Ready and healthy, "
            f"{len(row.members)} members)"
        )

    shown = "; ".join(clean(one(row)) for row in rows[:5])
    return shown + (f" and {len(rows) - 5} more" if len(rows) > 5 else "")


def in_service(row: PoolRow | None) -> bool:
    """Every member it asks for is there, Ready and probed healthy, and none more (a scale-down
    still under way is not done)."""
    if row is None:
        return False
    seen = row.figures
    return seen.members == seen.desired == seen.healthy and not row.view.deleting


def _ready_label(rows: list[PoolRow | None]) -> str:
    done = sum(1 for row in rows if in_service(row))
    return f"waiting for {len(rows)} pools to be Ready and healthy ({done} are)"


async def wait_in_service(
    conn: Connection, keys: list[tuple[str, str]], left: float, timeout: float
) -> NotDone | None:
    """``apply --wait`` for the pools of the files: None once each has its members Ready and
    healthy, else why not (exit 10). ``left`` of the ``timeout`` is what the proxies of the same
    files did not take."""
    rows = await poolviews.wait_for(conn, keys, in_service, _ready_label, left)
    pending = [row for row in rows if row is not None and not in_service(row)]
    gone = [
        f"proxypool {ns}/{name}" for (ns, name), row in zip(keys, rows, strict=True) if row is None
    ]
    if gone:
        return NotDone(f"{'; '.join(clean(g) for g in gone)}: removed while waiting")
    if not pending:
        return None
    return NotDone(
        f"not Ready and healthy within {timeout:g}s: {_pending(pending)}; see "
        "`egress-proxies describe pool NAME -n NAMESPACE` (is the pool controller running?)"
    )


def pool_kind(value: str) -> bool:
    return value.lower() in POOL_KINDS
