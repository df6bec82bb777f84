"""How the CLI shows events and streams: pure formatting, no server."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from rich.console import Console
from rich.table import Table

from events import codec
from events.schemas import (
    EVENT_TYPES,
    Event,
    HealthChanged,
    InstanceObserved,
    InstanceState,
    LeaseAcquired,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxyMode,
    ProxySpec,
    ProxySpecChanged,
)
from services.cli.log.reader import decode_entry
from services.cli.pure.entries import UNKNOWN_TYPE, LogEntry
from services.cli.pure.render import (
    MAIN_FIELDS,
    StreamRow,
    clean,
    event_json,
    event_row,
    events_table,
    format_time,
    format_value,
    human_bytes,
    inert,
    json_text,
    streams_table,
    summary,
)

STAMP = datetime(2025, 3, 4, 5, 6, 7, 891234, tzinfo=UTC)


def entry_of(event: HealthChanged | PhaseChanged | ProxyDeclared, seq: int = 7) -> LogEntry:
    data = codec.encode(event)
    headers = codec.envelope_headers(event, "id")
    return decode_entry(seq, STAMP, "proxy.p1.health", data, headers)


def render(table: Table) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(table)
    return out.getvalue()


def test_time_is_utc_iso_with_milliseconds_whatever_the_zone() -> None:
    assert format_time(STAMP) == "2025-03-04T05:06:07.891Z"
    plus_two = STAMP.astimezone(timezone(timedelta(hours=2)))
    assert format_time(plus_two) == "2025-03-04T05:06:07.891Z"
    assert format_time(STAMP.replace(tzinfo=None)) == "2025-03-04T05:06:07.891Z"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (True, "true"),
        (False, "false"),
        (3, "3"),
        (12.5, "12.5"),
        ("Ready", "Ready"),
        ("connection refused", '"connection refused"'),
        ("", '""'),
        ("a=b", '"a=b"'),
        ({"zone": "a"}, '{"zone":"a"}'),
    ],
)
def test_values_are_short_and_unambiguous(value: object, shown: str) -> None:
    assert format_value(value) == shown


def test_long_values_are_cut() -> None:
    shown = format_value("x" * 500)
    assert len(shown) == 60
    assert shown.endswith("…")


def test_summary_shows_the_main_fields_and_skips_empty_ones() -> None:
    event = PhaseChanged(phase=Phase.FAILED, reason="Permanent", message="quota gone for good")
    assert summary(event) == 'phase=Failed reason=Permanent message="quota gone for good"'
    healthy = HealthChanged(healthy=False, latency_ms=0.0)
    assert summary(healthy) == "healthy=false latency_ms=0"


def test_summary_reaches_into_the_spec() -> None:
    event = ProxyDeclared(uid="u", namespace="crawl", name="p1", spec=ProxySpec(provider="local"))
    assert summary(event) == "namespace=crawl name=p1 provider=local generation=1 source=cli"
    external = ProxySpec(mode=ProxyMode.EXTERNAL, provider="static")
    changed = ProxySpecChanged(uid="u", spec=external, generation=2)
    assert summary(changed) == "provider=static mode=External generation=2"


def test_every_event_type_has_main_fields() -> None:
    """A new type without an entry would fall back to all its scalars: noisy, never wrong, but
    the table is the first thing an operator reads, so each type chooses its own."""
    assert set(MAIN_FIELDS) == set(EVENT_TYPES)
    for name, fields in MAIN_FIELDS.items():
        known = EVENT_TYPES[name].__struct_fields__
        assert all(f.split(".")[0] in known for f in fields), name


def test_a_row_has_seq_time_subject_type_summary() -> None:
    event = InstanceObserved(
        command_id="c1",
        provider="local",
        provider_id="i-1",
        state=InstanceState.RUNNING,
        ip="10.0.0.9",
    )
    row = event_row(decode_entry(42, STAMP, "proxy.p1.instance", codec.encode(event), None))
    assert row == (
        "42",
        "2025-03-04T05:06:07.891Z",
        "proxy.p1.instance",
        "InstanceObserved",
        "provider_id=i-1 state=Running ip=10.0.0.9",
    )


def test_unknown_and_undecodable_events_are_shown_with_the_reason() -> None:
    unknown = decode_entry(1, STAMP, "proxy.p1.status", b"{}", {codec.HDR_EVENT_TYPE: "Teleported"})
    assert unknown.type == UNKNOWN_TYPE
    assert unknown.event is None
    assert "Teleported" in event_row(unknown)[4]
    broken = decode_entry(2, STAMP, "proxy.p1.health", b"not json", None)
    assert broken.type == UNKNOWN_TYPE
    assert "not valid JSON" in event_row(broken)[4]


def test_json_line_carries_the_whole_event() -> None:
    event = LeaseAcquired(lease_id="l1", proxy_uid="p1", ttl_seconds=30, selector={"zone": "a"})
    line = event_json(decode_entry(3, STAMP, "lease.p1", codec.encode(event), None))
    assert "\n" not in line
    assert json.loads(line) == {
        "seq": 3,
        "time": "2025-03-04T05:06:07.891Z",
        "subject": "lease.p1",
        "type": "LeaseAcquired",
        "event": {
            "type": "LeaseAcquired",
            "lease_id": "l1",
            "proxy_uid": "p1",
            "holder": "",
            "ttl_seconds": 30,
            "selector": {"zone": "a"},
            "fencing_token": 0,
            "cooldown_seconds": 0.0,
            "requested_ttl_seconds": 0.0,
            "client": "",
            "target": "",
        },
    }


def test_json_line_of_a_broken_event_keeps_the_payload() -> None:
    line = json.loads(event_json(decode_entry(4, STAMP, "proxy.p1.health", b"\xffoops", None)))
    assert line["type"] == "?"
    assert line["event"] is None
    assert "not valid JSON" in line["error"]
    assert line["payload"] == "\ufffdoops"


def test_events_table_has_the_columns_and_no_markup_injection() -> None:
    event = PhaseChanged(phase=Phase.FAILED, message="[bold]boom[/bold]")
    text = render(events_table([entry_of(event)]))
    assert text.split()[:5] == ["SEQ", "TIME", "SUBJECT", "TYPE", "SUMMARY"]
    assert "[bold]boom[/bold]" in text
    headless = render(events_table([entry_of(event)], header=False))
    assert "SUMMARY" not in headless


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (5 * 1024**2 + 1, "5.0 MiB"),
        (3 * 1024**5, "3072.0 TiB"),
    ],
)
def test_human_bytes(count: int, shown: str) -> None:
    assert human_bytes(count) == shown


def test_streams_table_shows_figures_and_missing_streams() -> None:
    rows = [
        StreamRow("PROXY", ("proxy.*.*",), 1234, 2048, 1, 1234, 3, 2),
        StreamRow("GC", missing=True),
    ]
    text = render(streams_table(rows))
    for column in ("STREAM", "SUBJECTS", "MESSAGES", "BYTES", "FIRST SEQ", "LAST SEQ", "REPLICAS"):
        assert column in text
    proxy_line = next(line for line in text.splitlines() if "PROXY" in line)
    assert "proxy.*.*" in proxy_line
    assert "1,234" in proxy_line
    assert "2.0 KiB" in proxy_line
    gc_line = next(line for line in text.splitlines() if " GC " in line)
    assert "missing" in gc_line


class Teleported(Event, frozen=True, kw_only=True):
    """A type the summary table does not know, like one a newer release adds."""

    where: str
    hops: int
    empty: str = ""
    spec: ProxySpec = ProxySpec()


def test_a_type_not_in_the_table_shows_its_non_empty_scalars() -> None:
    assert "Teleported" not in MAIN_FIELDS
    assert summary(Teleported(where="moon", hops=2)) == "where=moon hops=2"


# ------------------------------------------------------------------- untrusted text is inert

HOSTILE = (
    "[/bogus]",
    "[bold red]X[/]",
    "\x1b[31mred\x1b[0m",
    "\x1b]0;title\x07",
    "over\rwrite",
    "\x9b2J",
    "admin\u202etxt.exe",
    "bad\udcff",
    ":thumbs_up:",
)
UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def shown(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=300, color_system=None).print(renderable)
    return out.getvalue()


@pytest.mark.parametrize("text", HOSTILE)
def test_inert_text_is_shown_literally_and_acts_on_nothing(text: str) -> None:
    out = shown(inert(text))
    assert not UNSAFE.search(out)
    assert out.rstrip("\n") == clean(text)
    assert clean(text).isprintable()


def test_clean_spells_control_characters_and_keeps_markup_and_unicode() -> None:
    assert clean("[b]caf\u00e9\x1b[0m\u202e") == "[b]caf\u00e9\\x1b[0m\\u202e"
    assert clean(3) == "3"
    assert clean("two\nlines\x1b", multiline=True) == "two\nlines\\x1b"
    assert clean("two\nlines") == "two\\nlines"


def test_json_text_is_the_same_json_with_nothing_a_terminal_acts_on() -> None:
    value = {"holder": "".join(HOSTILE), "name": "caf\u00e9 \u65e5\u672c", "n": [1, None]}
    text = json_text(value, indent=2)
    assert json.loads(text) == value
    assert not UNSAFE.search(text)
    assert "caf\u00e9 \u65e5\u672c" in text  # readable, not \u-escaped


@pytest.mark.parametrize("text", [t for t in HOSTILE if "\udcff" not in t])
def test_events_table_and_json_lines_are_inert(text: str) -> None:
    """Every string an event can carry (UTF-8 has no lone surrogates)."""
    event = PhaseChanged(phase=Phase.FAILED, reason=text, message=f"a {text} b", ip=text)
    entry = decode_entry(9, STAMP, f"proxy.{text}.status", codec.encode(event), None)
    table = render(events_table([entry]))
    assert not UNSAFE.search(table)
    assert clean(text) in table
    line = event_json(entry)
    assert not UNSAFE.search(line)
    assert json.loads(line)["event"]["reason"] == text


def test_streams_table_is_inert() -> None:
    rows = [
        StreamRow("\x1b[31mPROXY[/]", ("proxy.\x9b.*", "[b]x")),
        StreamRow("[/x]", missing=True),
    ]
    text = render(streams_table(rows))
    assert not UNSAFE.search(text)
    assert "\\x1b[31mPROXY[/]" in text
    assert "proxy.\\x9b.*, [b]x" in text
    assert "[/x]" in text
