"""``traffic``: what the gateway relayed, per client, proxy, lease or host, over a time range
of the TRAFFIC stream (docs/decisions/0158-traffic-records.md).

A CLI command rather than an API route: the question is an operator's, about the past, and the
command reads the stream the way ``events`` does, with whatever NATS user the operator reads the
log as; a route would need a scope and bounds of its own on a fold of up to a week of records.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import click
from rich.table import Table

from events.durations import parse_duration
from events.store import Recorded
from events.subjects import TRAFFIC_STREAM
from events.traffic import client_key
from projections import traffic
from projections.traffic import Scope, Totals, TrafficView
from services.cli.common import (
    CliState,
    open_connection,
    run_until_signalled,
    settings_for,
    settings_options,
    stdout_console,
    table_or_json_lines,
)
from services.cli.log.reader import LogReader
from services.cli.log.timetravel import instant_option
from services.cli.pure.render import clean, format_time

MAX_SINCE = 366 * 86_400.0
BY = {"client": "clients", "proxy": "proxies", "lease": "leases", "host": "hosts"}
COLUMNS = (
    ("requests", "requests"),
    ("tunnels", "tunnels"),
    ("bytes_up", "up"),
    ("bytes_down", "down"),
    ("status_2xx", "2xx"),
    ("status_3xx", "3xx"),
    ("status_4xx", "4xx"),
    ("status_5xx", "5xx"),
    ("blocked", "blocked"),
    ("failed", "failed"),
)


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    del ctx, param
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not 0 < seconds <= MAX_SINCE:
        raise click.BadParameter("from 1ms to 366 days back (the stream keeps 7 days): e.g. 1h")
    return seconds


@click.command("traffic")
@settings_options()
@click.option(
    "--by",
    type=click.Choice(tuple(BY)),
    default="client",
    show_default=True,
    help="One row per client, proxy, lease or target host.",
)
@click.option("--client", metavar="NAME", help="Only this client's traffic.")
@click.option("--proxy", metavar="UID|NS/NAME", help="Only the traffic through this proxy.")
@click.option(
    "--since",
    default="1h",
    show_default=True,
    callback=_duration,
    metavar="DURATION",
    help="How far back from the end (now, or --at) the range starts, e.g. 10m, 24h.",
)
@click.option(
    "--at",
    metavar="TIME",
    callback=instant_option,
    help="The end of the range (ISO 8601, e.g. 2026-03-01T14:30:00Z; no zone: UTC), by the "
    "server's timestamps: the traffic recorded before then.",
)
@table_or_json_lines
@click.pass_obj
def traffic_cmd(
    state: CliState,
    *,
    nats_url: str | None,
    by: str,
    client: str | None,
    proxy: str | None,
    since: float,
    at: datetime | None,
    output: str,
) -> None:
    """What the gateway relayed: requests, tunnels, bytes, answers by class, blocks and failures.

    Summed from the gateway's traffic records (one per client, proxy and lease every
    --traffic-interval) stored in the range; a record is stored up to one interval after the
    traffic it counts. Records no reader can use are left out and counted.
    """
    settings = settings_for(state, nats_url=nats_url)
    end = at or datetime.now(UTC)
    try:
        start = end - timedelta(seconds=since)
    except OverflowError:  # an --at in the first year of the calendar
        start = datetime.min.replace(tzinfo=UTC)
    scope = Scope(since=start, until=end, client=client, proxy=proxy)
    view = run_until_signalled(_fold(settings.nats_url, scope))
    if view is None:
        return
    rows = traffic.table(view, BY[by])
    if output == "json":
        for key, sums in rows:
            click.echo(json.dumps(_json(view, by, key, sums)))
    else:
        stdout_console().print(_table(view, by, rows))
    if view.unusable:
        click.echo(f"{view.unusable} records no reader can use were left out", err=True)
    if not rows:
        click.echo(f"no traffic recorded from {format_time(start)} to {format_time(end)}", err=True)


async def _fold(url: str, scope: Scope) -> TrafficView:
    subject = f"traffic.{client_key(scope.client)}" if scope.client else "traffic.*"
    conn = await open_connection(url)
    # The server skips what came before the range: a week of a busy fleet is not read whole.
    reader = LogReader(conn, TRAFFIC_STREAM, subject, start_time=scope.since)
    view = TrafficView(scope=scope)
    try:
        async for batch in reader.batches():
            for entry in batch:
                if scope.until is not None and entry.time >= scope.until:
                    return view  # stored in order: the rest is later still
                if scope.since is not None and entry.time < scope.since:
                    continue
                if entry.event is None:
                    view.unusable += 1  # undecodable, or a newer writer's type
                    continue
                recorded = Recorded(entry.event, entry.seq, entry.subject, entry.time)
                view = traffic.apply(view, recorded)
    finally:
        await reader.close()
        await conn.close()
    return view


def _name(view: TrafficView, by: str, key: str) -> str:
    if by == "proxy":
        return view.proxy_names.get(key, key)
    return key


def _json(view: TrafficView, by: str, key: str, sums: Totals) -> dict[str, object]:
    row: dict[str, object] = {by: _name(view, by, key)}
    if by == "proxy":
        row["proxy_uid"] = key
    row |= {name: getattr(sums, name) for name, _ in COLUMNS}
    return row


def _table(view: TrafficView, by: str, rows: list[tuple[str, Totals]]) -> Table:
    table = Table(title=f"traffic by {by}", title_justify="left")
    table.add_column(by.upper())
    for _, label in COLUMNS:
        table.add_column(label.upper(), justify="right")
    for key, sums in rows:
        values = [str(getattr(sums, name)) for name, _ in COLUMNS]
        table.add_row(clean(_name(view, by, key)), *values)
    if rows:
        total = [str(getattr(view.total, name)) for name, _ in COLUMNS]
        table.add_row("TOTAL", *total, style="bold")
    return table
