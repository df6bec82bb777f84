"""How the CLI shows events and streams: pure functions from values to text and rich tables.

Everything the CLI shows that it did not write itself (names, holders, messages, URLs from the log
or the discovery API, paths from the command line) goes through ``inert`` (a rich ``Text``, never
markup) or ``clean`` (a plain string): ``[bold]`` stays literal, and control characters (escape
sequences, carriage returns, bidi overrides) are shown as escapes instead of acting on the
terminal. JSON output is made equally inert by ``json_text``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from rich.table import Table
from rich.text import Text

from events import codec
from events.schemas import Event
from services.cli.pure.entries import LogEntry
from services.runtime.pure.text import UNSAFE_CODES, printable

MAX_VALUE = 60
EVENT_COLUMNS = ("SEQ", "TIME", "SUBJECT", "TYPE", "SUMMARY")

# The fields that tell one event of a type from another; the rest is in `-o json`.
# Dotted names reach into nested structs. A type missing here shows its scalar fields.
MAIN_FIELDS: Mapping[str, tuple[str, ...]] = {
    "ProxyDeclared": ("namespace", "name", "spec.provider", "spec.mode", "generation", "source"),
    "ProxySpecChanged": ("spec.provider", "spec.mode", "generation"),
    "ProxyDeletionRequested": ("uid",),
    "ProxyRemoved": ("uid",),
    "CreateInstance": ("provider", "instance_name", "command_id"),
    "ObserveInstance": ("provider", "provider_id", "command_id"),
    "DeleteInstance": ("provider", "provider_id", "command_id"),
    "InstanceCreated": ("provider", "provider_id"),
    "InstanceObserved": ("provider_id", "state", "ip"),
    "InstanceGone": ("provider", "provider_id"),
    "ProviderFailed": ("provider", "operation", "error_class", "message"),
    "HealthChanged": ("healthy", "reason", "latency_ms", "message"),
    "EgressObserved": ("ip", "country", "asn", "org", "error"),
    "EgressChanged": ("old_ip", "ip", "country", "asn", "org"),
    "PhaseChanged": ("phase", "reason", "ip", "message"),
    "LeaseAcquired": ("lease_id", "holder", "ttl_seconds"),
    "LeaseReleased": ("lease_id", "cooldown_seconds", "reason"),
    "LeaseReported": ("lease_id", "outcome", "detail"),
    "LeaseExpired": ("lease_id",),
    "LeaseRenewed": ("lease_id", "ttl_seconds"),
    "OrphanFound": ("provider", "kind", "provider_id", "owner_uid"),
    "OrphanDeleted": ("provider", "kind", "provider_id", "owner_uid"),
    "SweepCompleted": ("listed", "orphans", "deleted", "skipped", "reason"),
    "DeadLettered": ("consumer", "subject", "sequence", "deliveries", "reason"),
    "RotationRequested": ("rotation_id", "lease_id", "reason"),
    "ReplacementStarted": ("rotation_id", "reason", "command_id"),
    "ReplacementPromoted": ("rotation_id", "provider_id", "retired_provider_id", "ip"),
    "RotationEnded": ("rotation_id", "outcome", "message"),
    "LeaseSwitched": ("lease_id", "rotation_id", "provider_id", "ip"),
    "PoolDeclared": ("namespace", "name", "spec.replicas", "generation", "source"),
    "PoolSpecChanged": ("spec.replicas", "generation"),
    "PoolScaled": ("replicas",),
    "PoolDeletionRequested": ("uid",),
    "PoolRemoved": ("uid",),
    "PoolDecided": ("reason", "message", "figures.members", "figures.ready", "figures.leased"),
    "PoolPressure": ("pressure", "wanted", "figures.leased", "figures.unserved"),
    "PoolDemand": ("replica", "waiting", "unserved", "refused"),
    "TrafficRecorded": ("client", "proxy", "lease_id", "interval_seconds", "replica"),
    "UpstreamMetered": ("provider", "proxy_uid", "lease_id", "bytes_up", "bytes_down"),
}


def clean(value: object, *, multiline: bool = False) -> str:
    """For text that is only mostly ours: an escape sequence in it is then seen, not obeyed, and
    a line break cannot fake a line of output (``multiline`` keeps ours, in messages we laid out).
    """
    return printable(str(value), multiline=multiline)


def inert(value: object, style: str = "") -> Text:
    """A cell or a line for rich: a string would be parsed as markup (``[/x]`` raises, ``[red]``
    styles, ``:smile:`` turns into an emoji); ``Text`` never is."""
    return Text(clean(value), style=style)


# What JSON leaves raw with ensure_ascii=False but a terminal acts on or cannot print: everything
# ``printable`` spells out but C0, which JSON escapes itself (and whose line breaks indent it).
_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in UNSAFE_CODES if code >= 0x20}


def json_text(
    value: object, *, indent: int | None = None, separators: tuple[str, str] | None = None
) -> str:
    """JSON for tools that is safe on a terminal too, with non-ASCII text left readable. Outside
    C0 these characters can only occur inside strings, where an escape means the same."""
    text = json.dumps(value, ensure_ascii=False, indent=indent, separators=separators)
    return text.translate(_JSON_ESCAPES)


def format_time(value: datetime) -> str:
    """UTC, millisecond precision, ``Z``: sortable, and the same whatever the viewer's zone."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_value(value: object) -> str:
    """Strings are quoted only when they would be ambiguous (empty, spaces, ``=``, quotes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if not isinstance(value, str):
        return _cut(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str))
    text = _cut(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        text = json.dumps(text, ensure_ascii=False)
    return text


def _cut(text: str) -> str:
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def _lookup(data: Mapping[str, object], dotted: str) -> object:
    value: object = data
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def summary(event: Event) -> str:
    """``key=value`` pairs of the fields that matter, skipping empty ones."""
    data = codec.to_builtins(event)
    data.pop("type", None)
    names = MAIN_FIELDS.get(codec.event_type(event))
    if names is None:
        names = tuple(k for k, v in data.items() if isinstance(v, str | int | float | bool))
    pairs = []
    for name in names:
        value = _lookup(data, name)
        if value is None or value == "":
            continue
        pairs.append(f"{name.rsplit('.', 1)[-1]}={format_value(value)}")
    return " ".join(pairs)


def entry_summary(entry: LogEntry) -> str:
    if entry.skipped:
        # Said first: every service skips this event, whatever it looks like.
        text = f"SKIPPED ({entry.skipped}) error={format_value(entry.error)}"
        return text if entry.event is None else f"{text} {summary(entry.event)}"
    if entry.event is None:
        return f"error={format_value(entry.error)}"
    return summary(entry.event)


def event_row(entry: LogEntry) -> tuple[str, str, str, str, str]:
    return (
        str(entry.seq),
        format_time(entry.time),
        entry.subject,
        entry.type,
        entry_summary(entry),
    )


def event_json(entry: LogEntry) -> str:
    """One self-contained line: ``jq`` can filter it without knowing the event types."""
    record: dict[str, object] = {
        "seq": entry.seq,
        "time": format_time(entry.time),
        "subject": entry.subject,
        "type": entry.type,
        "event": None if entry.event is None else codec.to_builtins(entry.event),
    }
    if entry.skipped:
        record["skipped"] = entry.skipped
        record["error"] = entry.error
    if entry.event is None:
        record["error"] = entry.error
        record["payload"] = entry.payload.decode("utf-8", errors="replace")
    return json_text(record, separators=(",", ":"))


def events_table(entries: Iterable[LogEntry], *, header: bool = True) -> Table:
    """A table for one batch; later batches of ``--follow`` go without the header, and the
    minimum widths keep their columns roughly under it."""
    table = Table(box=None, show_header=header, header_style="bold", pad_edge=False)
    table.add_column("SEQ", justify="right", min_width=5, no_wrap=True)
    table.add_column("TIME", min_width=24, no_wrap=True)
    table.add_column("SUBJECT", min_width=24, no_wrap=True)
    table.add_column("TYPE", min_width=22, no_wrap=True)
    table.add_column("SUMMARY", overflow="fold")
    for entry in entries:
        seq, time, subject, kind, text = event_row(entry)
        style = "red" if entry.event is None or entry.skipped else ""
        table.add_row(seq, time, inert(subject), inert(kind, style), inert(text, style))
    return table


def human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class StreamRow:
    """A stream's figures; ``missing`` when it has not been created (then the figures are 0)."""

    stream: str
    subjects: tuple[str, ...] = ()
    messages: int = 0
    bytes: int = 0
    first_seq: int = 0
    last_seq: int = 0
    replicas: int = 0
    consumers: int = 0
    missing: bool = False


STREAM_COLUMNS = (
    "STREAM",
    "SUBJECTS",
    "MESSAGES",
    "BYTES",
    "FIRST SEQ",
    "LAST SEQ",
    "REPLICAS",
    "CONSUMERS",
)


def streams_table(rows: Iterable[StreamRow]) -> Table:
    table = Table(header_style="bold")
    for name in STREAM_COLUMNS:
        numeric = name not in ("STREAM", "SUBJECTS")
        table.add_column(name, justify="right" if numeric else "left", no_wrap=True)
    for row in rows:
        if row.missing:
            table.add_row(inert(row.stream), Text("missing: run `streams init`", style="yellow"))
            continue
        table.add_row(
            inert(row.stream),
            inert(", ".join(row.subjects)),
            f"{row.messages:,}",
            human_bytes(row.bytes),
            str(row.first_seq),
            str(row.last_seq),
            str(row.replicas),
            str(row.consumers),
        )
    return table
