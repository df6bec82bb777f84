"""``streams check``: every stored event no reader can use, in one list.

The services skip such events and count them (``egress_events_skipped_total``), so the system
keeps working; this is where an operator sees which events they were, to read them with
``egress-proxies events`` or the nats CLI and fix the writer that produced them. The log is
immutable: the events themselves stay for the stream's retention.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import click
from rich.table import Table
from rich.text import Text

from events.subjects import DEADLETTER_STREAM, GC_STREAM, LEASE_STREAM, PROXY_STREAM
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
from services.cli.pure.entries import LogEntry
from services.cli.pure.render import inert

CHECKED = (PROXY_STREAM, LEASE_STREAM, GC_STREAM, DEADLETTER_STREAM)
EXIT_UNUSABLE = 9
SUBJECTS = {
    PROXY_STREAM: "proxy.*.*",
    LEASE_STREAM: "lease.*",
    GC_STREAM: "gc.*",
    DEADLETTER_STREAM: "deadletter.>",
}


@dataclass
class Report:
    read: dict[str, int] = field(default_factory=dict)
    unusable: list[tuple[str, LogEntry]] = field(default_factory=list)


@click.command("check")
@settings_options()
@click.option(
    "--stream",
    "only",
    type=click.Choice(CHECKED, case_sensitive=False),
    default=None,
    help="Check only this stream [default: all of them].",
)
@table_or_json_lines
@click.pass_obj
def check(state: CliState, nats_url: str | None, only: str | None, output: str) -> None:
    """List every stored event no fold can use: payloads that do not decode, types this
    version does not know, and events the proxy or lease fold cannot apply.

    Exits 9 when there is at least one (0 when the log is clean), so a script or a CI job can
    watch for writers that put bad events into the log.
    """
    settings = settings_for(state, nats_url=nats_url)
    streams = (only.upper(),) if only else CHECKED
    report = run_until_signalled(_check(settings.nats_url, streams))
    if report is None:
        return
    if output == "json":
        for stream, entry in report.unusable:
            click.echo(json.dumps(_as_json(stream, entry), separators=(",", ":")))
    else:
        _print(report)
    if report.unusable:
        raise click.exceptions.Exit(EXIT_UNUSABLE)


async def _check(url: str, streams: tuple[str, ...]) -> Report:
    conn = await open_connection(url)
    report = Report()
    try:
        for stream in streams:
            reader = LogReader(conn, stream, SUBJECTS[stream])
            folds = FoldCheck(stream)
            count = 0
            try:
                async for batch in reader.batches():
                    for entry in batch:
                        count += 1
                        checked = folds.check(entry)
                        if checked.skipped:
                            report.unusable.append((stream, checked))
            finally:
                await reader.close()
            report.read[stream] = count
    finally:
        await conn.close()
    return report


def _as_json(stream: str, entry: LogEntry) -> dict[str, object]:
    return {
        "stream": stream,
        "seq": entry.seq,
        "subject": entry.subject,
        "type": entry.type,
        "reason": entry.skipped,
        "detail": entry.error,
    }


def _print(report: Report) -> None:
    console = stdout_console()
    if report.unusable:
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in ("STREAM", "SEQ", "SUBJECT", "TYPE", "REASON", "DETAIL"):
            table.add_column(column, overflow="fold", no_wrap=column != "DETAIL")
        for stream, entry in report.unusable:
            table.add_row(
                stream,
                str(entry.seq),
                inert(entry.subject),
                inert(entry.type),
                inert(entry.skipped, "red"),
                inert(entry.error),
            )
        console.print(table)
    for stream, count in report.read.items():
        bad = sum(1 for s, _ in report.unusable if s == stream)
        line = f"{stream}: {count} events read, {bad} no fold can use"
        console.print(Text(line, style="red" if bad else ""))
