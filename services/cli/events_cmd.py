"""``events``: the event log, decoded and in order; one proxy's history; tailing it."""

from __future__ import annotations

import click

from events.schemas import DeadLettered, OrphanDeleted, OrphanFound
from events.subjects import (
    DEADLETTER_STREAM,
    GC_STREAM,
    LEASE_STREAM,
    PROXY_STREAM,
    InvalidToken,
    check_token,
    proxy_uid_of,
)
from services.cli.common import (
    CliState,
    open_connection,
    run_until_signalled,
    settings_for,
    settings_options,
    stdout_console,
    table_or_json_lines,
)
from services.cli.entries import LogEntry
from services.cli.reader import FoldCheck, LogReader
from services.cli.render import event_json, events_table
from services.runtime.eventlog.streams import STREAMS

STREAM_NAMES = (PROXY_STREAM, LEASE_STREAM, GC_STREAM, DEADLETTER_STREAM)
_ALL_SUBJECTS = {spec.name: spec.subjects[0] for spec in STREAMS}


def filter_subject(stream: str, proxy_uid: str | None) -> str:
    """The server-side filter: a proxy's own subjects where the stream is keyed by proxy."""
    if proxy_uid and stream == PROXY_STREAM:
        return f"proxy.{proxy_uid}.>"
    if proxy_uid and stream == LEASE_STREAM:
        return f"lease.{proxy_uid}"
    return _ALL_SUBJECTS[stream]


def concerns(entry: LogEntry, proxy_uid: str) -> bool:
    """For streams keyed by something else (provider, consumer): does the event name the proxy?

    An undecodable message names nobody, so a per-proxy view of these streams leaves it out.
    """
    match entry.event:
        case OrphanFound(owner_uid=owner) | OrphanDeleted(owner_uid=owner):
            return owner == proxy_uid
        case DeadLettered(subject=subject):
            try:
                return proxy_uid_of(subject) == proxy_uid
            except InvalidToken:
                return False
    return False


def _check_uid(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check_token("proxy uid", value)
    except InvalidToken as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("events")
@settings_options()
@click.option(
    "--proxy",
    "proxy_uid",
    metavar="UID",
    callback=_check_uid,
    help="Only this proxy's events (in GC and DEADLETTER: the events that name it).",
)
@click.option(
    "--stream",
    type=click.Choice(STREAM_NAMES, case_sensitive=False),
    default=PROXY_STREAM,
    show_default=True,
    help="Which event stream to read.",
)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until Ctrl-C.")
@table_or_json_lines
@click.pass_obj
def events(
    state: CliState,
    *,
    nats_url: str | None,
    proxy_uid: str | None,
    stream: str,
    follow: bool,
    output: str,
) -> None:
    """Replay (or tail) the event log, decoded.

    Events are shown in stream order with the server's timestamp. An event the services skip
    (an unknown type from a newer writer, a broken payload, a value the fold cannot apply) is
    shown marked SKIPPED with the reason (in JSON: "skipped"), never left out.
    """
    settings = settings_for(state, nats_url=nats_url)
    run_until_signalled(_show(settings.nats_url, stream.upper(), proxy_uid, follow, output))


async def _show(url: str, stream: str, proxy_uid: str | None, follow: bool, output: str) -> None:
    subject = filter_subject(stream, proxy_uid)
    keyed = proxy_uid is None or stream in (PROXY_STREAM, LEASE_STREAM)
    conn = await open_connection(url, lasting=follow)
    reader = LogReader(conn, stream, subject)
    # Folded as the services fold it, so an event they skip is marked as skipped here too. A
    # per-proxy read sees the whole of that proxy's aggregate, which is all its fold needs.
    folds = FoldCheck(stream)
    console = stdout_console()
    shown = 0
    try:
        async for batch in reader.batches(follow=follow):
            entries = [folds.check(entry) for entry in batch]
            if proxy_uid is not None and not keyed:
                entries = [entry for entry in batch if concerns(entry, proxy_uid)]
            if not entries:
                continue
            if output == "json":
                for entry in entries:
                    click.echo(event_json(entry))
            else:
                console.print(events_table(entries, header=shown == 0))
                console.file.flush()
            shown += len(entries)
    finally:
        await reader.close()
        await conn.close()
    if shown == 0 and not follow:
        what = f"{stream} for proxy {proxy_uid}" if proxy_uid else stream
        click.echo(f"no events in {what}", err=True)
