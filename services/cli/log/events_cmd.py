"""``events``: the event log, decoded and in order; one proxy's history; tailing it."""

from __future__ import annotations

from datetime import datetime

import click

from events.schemas import DeadLettered, OrphanDeleted, OrphanFound, PoolDecided
from events.subjects import (
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
from services.cli.log.reader import FoldCheck, LogReader
from services.cli.log.timetravel import instant_option
from services.cli.pure.entries import LogEntry
from services.cli.pure.render import event_json, events_table, format_time
from services.runtime.eventlog.streams import STREAMS

STREAM_NAMES = tuple(spec.name for spec in STREAMS)
"""Every stream of the log: derived, so a stream added is one ``events`` can show."""
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
        case PoolDecided(added=added, retired=retired, recycled=recycled, rolled=rolled):
            named = {m.uid for m in added}.union(retired, recycled, rolled)
            return proxy_uid in named
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
@click.option(
    "--until",
    metavar="TIME",
    callback=instant_option,
    help="Only the events stored up to TIME (ISO 8601, e.g. 2026-03-01T14:30:00Z; no zone: "
    "UTC), by the server's timestamp: the history as it was then.",
)
@table_or_json_lines
@click.pass_obj
def events(
    state: CliState,
    *,
    nats_url: str | None,
    proxy_uid: str | None,
    stream: str,
    follow: bool,
    until: datetime | None,
    output: str,
) -> None:
    """Replay (or tail) the event log, decoded.

    Events are shown in stream order with the server's timestamp. An event the services skip
    (an unknown type from a newer writer, a broken payload, a value the fold cannot apply) is
    shown marked SKIPPED with the reason (in JSON: "skipped"), never left out.
    """
    if follow and until is not None:
        raise click.UsageError("--follow and --until: use one; --until shows a past history")
    settings = settings_for(state, nats_url=nats_url)
    show = _show(settings.nats_url, stream.upper(), proxy_uid, follow, output, until)
    run_until_signalled(show)


async def _show(  # noqa: PLR0917 - the command's options, passed on
    url: str,
    stream: str,
    proxy_uid: str | None,
    follow: bool,
    output: str,
    until: datetime | None = None,
) -> None:
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
        async for read in reader.batches(follow=follow):
            # The server stamps messages as it stores them, in stream order: the first one
            # after ``until`` ends the history.
            ended = until is not None and read[-1].time > until
            batch = [entry for entry in read if until is None or entry.time <= until]
            entries = [folds.check(entry) for entry in batch]
            if proxy_uid is not None and not keyed:
                entries = [entry for entry in batch if concerns(entry, proxy_uid)]
            if not entries:
                if ended:
                    break
                continue
            if output == "json":
                for entry in entries:
                    click.echo(event_json(entry))
            else:
                console.print(events_table(entries, header=shown == 0))
                console.file.flush()
            shown += len(entries)
            if ended:
                break
    finally:
        await reader.close()
        await conn.close()
    if shown == 0 and not follow:
        what = f"{stream} for proxy {proxy_uid}" if proxy_uid else stream
        what += f" up to {format_time(until)}" if until is not None else ""
        click.echo(f"no events in {what}", err=True)
