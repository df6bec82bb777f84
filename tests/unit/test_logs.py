"""Log lines and spans join up (docs/architecture.md, Telemetry): every line inside a span names it,
exactly once. Secrets never reach a line, and console lines cannot drive the terminal."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from services.runtime.observability import logs
from services.runtime.observability.logs import (
    REDACTED,
    add_trace_ids,
    configure_logging,
    is_secret_key,
    redact,
    scrub,
)
from services.runtime.pure.text import printable
from services.runtime.settings.errors import ConfigError
from tests.support.clirun import restore_logging_after

# A local provider: spans become current without installing anything process-wide.
tracer = TracerProvider().get_tracer("tests.logs")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    yield from restore_logging_after()
    structlog.contextvars.clear_contextvars()


@pytest.fixture
def out() -> io.StringIO:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    return stream


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def ids(span: trace.Span) -> tuple[str, str]:
    context = span.get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def test_a_line_inside_a_span_carries_its_ids_exactly_once(out: io.StringIO) -> None:
    with tracer.start_as_current_span("work") as span:
        structlog.get_logger("egress.test").info("inside", uid="p-1")
    raw = out.getvalue()
    assert raw.count('"traceID"') == 1
    assert raw.count('"spanID"') == 1
    (line,) = lines(out)
    assert (line["traceID"], line["spanID"]) == ids(span)
    assert re.fullmatch(r"[0-9a-f]{32}", line["traceID"])
    assert re.fullmatch(r"[0-9a-f]{16}", line["spanID"])
    assert "trace_id" not in line
    assert "span_id" not in line


def test_nested_spans_name_the_innermost(out: io.StringIO) -> None:
    log = structlog.get_logger("egress.test")
    with tracer.start_as_current_span("outer") as outer:
        log.info("a")
        with tracer.start_as_current_span("inner") as inner:
            log.info("b")
        log.info("c")
    a, b, c = lines(out)
    assert (a["traceID"], a["spanID"]) == ids(outer)
    assert (b["traceID"], b["spanID"]) == ids(inner)
    assert (c["traceID"], c["spanID"]) == ids(outer)
    assert a["traceID"] == b["traceID"]


def test_ids_a_caller_bound_are_replaced_not_repeated(out: io.StringIO) -> None:
    structlog.contextvars.bind_contextvars(traceID="0" * 32)
    log = structlog.get_logger("egress.test").bind(spanID="f" * 16)
    with tracer.start_as_current_span("work") as span:
        log.info("bound", traceID="1" * 32)
    raw = out.getvalue()
    assert raw.count("traceID") == 1
    assert raw.count("spanID") == 1
    (line,) = lines(out)
    assert (line["traceID"], line["spanID"]) == ids(span)


def test_no_ids_outside_a_span(out: io.StringIO) -> None:
    log = structlog.get_logger("egress.test")
    log.info("before")
    with tracer.start_as_current_span("work"):
        pass
    log.info("after")
    with trace.use_span(trace.INVALID_SPAN):
        log.info("invalid")
    for line in lines(out):
        assert "traceID" not in line
        assert "spanID" not in line
    assert [line["event"] for line in lines(out)] == ["before", "after", "invalid"]


def test_outside_a_span_a_callers_own_ids_are_left_alone(out: io.StringIO) -> None:
    structlog.get_logger("egress.test").info("relayed", traceID="ab" * 16)
    (line,) = lines(out)
    assert line["traceID"] == "ab" * 16
    assert "spanID" not in line


def test_ids_are_zero_padded_lowercase_hex() -> None:
    remote = SpanContext(
        trace_id=0xABC, span_id=0x1F, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
    )
    with trace.use_span(NonRecordingSpan(remote)):
        got = add_trace_ids(None, "info", {"event": "x"})
    assert got == {"event": "x", "traceID": "0" * 29 + "abc", "spanID": "0" * 14 + "1f"}


def test_stdlib_loggers_share_the_format_and_the_ids(out: io.StringIO) -> None:
    with tracer.start_as_current_span("work") as span:
        logging.getLogger("nats.aio.client").warning("reconnecting to %s", "nats://x:4222")
    raw = out.getvalue()
    assert raw.count('"traceID"') == 1
    (line,) = lines(out)
    assert line["event"] == "reconnecting to nats://x:4222"
    assert line["logger"] == "nats.aio.client"
    assert line["level"] == "warning"
    assert (line["traceID"], line["spanID"]) == ids(span)


def test_lines_carry_utc_timestamp_level_and_logger(out: io.StringIO) -> None:
    before = datetime.now(UTC)
    structlog.get_logger("egress.reconciler").warning("slow", seconds=3)
    (line,) = lines(out)
    assert line["timestamp"].endswith("Z")
    stamp = datetime.fromisoformat(line["timestamp"])
    assert stamp.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= stamp <= datetime.now(UTC) + timedelta(seconds=1)
    assert line["level"] == "warning"
    assert line["logger"] == "egress.reconciler"
    assert line["seconds"] == 3


def test_level_filters_both_kinds_of_logger() -> None:
    stream = io.StringIO()
    configure_logging("warning", "json", stream)
    structlog.get_logger("egress.test").info("dropped")
    logging.getLogger("uvicorn.error").info("dropped too")
    structlog.get_logger("egress.test").error("kept")
    logging.getLogger("uvicorn.error").warning("kept too")
    assert [line["event"] for line in lines(stream)] == ["kept", "kept too"]

    configure_logging("debug", "json", stream)
    structlog.get_logger("egress.test").debug("now shown")
    assert lines(stream)[-1]["event"] == "now shown"


def test_configuring_again_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    log = structlog.get_logger("egress.test")  # taken before configuring, as modules do
    configure_logging("info", "json", first)
    log.info("one")
    configure_logging("info", "json", second)
    log.info("two")
    logging.getLogger("nats").warning("three")
    assert [line["event"] for line in lines(first)] == ["one"]
    assert [line["event"] for line in lines(second)] == ["two", "three"]


def test_exceptions_are_rendered_into_the_json_line(out: io.StringIO) -> None:
    try:
        raise ValueError("broken spec")
    except ValueError:
        structlog.get_logger("egress.test").exception("failed")
    (line,) = lines(out)
    assert line["level"] == "error"
    assert "ValueError: broken spec" in line["exception"]


def test_console_format_carries_the_ids_once() -> None:
    stream = io.StringIO()
    configure_logging("info", "console", stream)
    with tracer.start_as_current_span("work") as span:
        structlog.get_logger("egress.test").info("readable", uid="p-1")
    text = stream.getvalue()
    trace_id, span_id = ids(span)
    assert text.count("traceID=") == 1
    assert f"traceID={trace_id}" in text
    assert f"spanID={span_id}" in text
    assert "readable" in text
    assert "egress.test" in text
    assert "\x1b[" not in text  # not a terminal: no colour codes


@pytest.mark.parametrize(
    ("level", "fmt", "named"),
    [("verbose", "json", "LOG_LEVEL"), ("info", "xml", "LOG_FORMAT")],
)
def test_invalid_settings_name_the_variable(level: str, fmt: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        configure_logging(level, fmt, io.StringIO())


# ------------------------------------------------------------------------------------ secrets

SECRET = "hunter2-Secret"


@pytest.mark.parametrize(
    "key",
    ["authorization", "Authorization", "token", "access_token", "X-Auth-Token", "nats_password",
     "PASSWORD", "client-secret", "credentials", "api_key", "Cookie", b"authorization"],
)  # fmt: skip
def test_secret_keys_are_recognised_whatever_their_spelling(key: str | bytes) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["event", "auth", "holder", "fencing_token", "url", 3, None])
def test_other_keys_are_not_secret(key: object) -> None:
    assert not is_secret_key(key)


def test_redaction_reaches_into_nested_values_and_header_lists() -> None:
    headers = {"Authorization": f"Bearer {SECRET}", "accept": "*/*"}
    value = {
        "headers": headers,
        "scope": {"headers": [(b"authorization", SECRET.encode()), (b"host", b"x")]},
        "items": [{"password": SECRET}, ("token", SECRET), ["Secret", SECRET]],
        "unset": {"token": "", "password": None},
    }
    assert redact(value) == {
        "headers": {"Authorization": REDACTED, "accept": "*/*"},
        "scope": {"headers": [(b"authorization", REDACTED), (b"host", b"x")]},
        "items": [{"password": REDACTED}, ("token", REDACTED), ["Secret", REDACTED]],
        "unset": {"token": "", "password": None},
    }
    assert headers["Authorization"] == f"Bearer {SECRET}"  # a copy; never mutated


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("nats://user:pw@h:4222", f"nats://user:{REDACTED}@h:4222"),
        ("to https://a:b@c/x and tls://d:e@f", f"to https://a:{REDACTED}@c/x and tls://d:{REDACTED}@f"),
        ("nats://s3cr3t@h:4222", f"nats://{REDACTED}@h:4222"),
        ("http://user@h/", "http://user@h/"),
        (
            "http://lease-1.7.1765000000000.0123456789abcdef0123456789abcdef:7.1.f@h:3128",
            f"http://lease-1.{REDACTED}:{REDACTED}@h:3128",
        ),
        (
            "http://egress-probe.1765000000000.0123456789abcdef0123456789abcdef@h",
            f"http://egress-probe.{REDACTED}@h",
        ),
        ("Authorization: Bearer abc.def-1", f"Authorization: Bearer {REDACTED}"),
        ("nats://h:4222 is fine", "nats://h:4222 is fine"),
        ("{'authorization': 'bearer x1'}", f"{{'authorization': 'bearer {REDACTED}'}}"),
        ("a bearer token holds only ASCII", "a bearer token holds only ASCII"),
        ('WWW-Authenticate: Bearer realm="egress"', 'WWW-Authenticate: Bearer realm="egress"'),
    ],
)  # fmt: skip
def test_secrets_inside_text_are_scrubbed(text: str, shown: str) -> None:
    assert scrub(text) == shown


def test_an_object_whose_repr_carries_a_secret_is_replaced_by_the_scrubbed_repr() -> None:
    class Dsn:
        def __repr__(self) -> str:
            return "Dsn('nats://u:pw@h')"

    plain = object()
    assert redact(Dsn()) == f"Dsn('nats://u:{REDACTED}@h')"
    assert redact(plain) is plain


def fail_with_a_secret_in_a_local() -> None:
    headers = {"authorization": f"Bearer {SECRET}"}
    raise RuntimeError(f"refused ({len(headers)} headers)")


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_no_secret_reaches_a_line_of_either_format(fmt: str) -> None:
    stream = io.StringIO()
    configure_logging("info", fmt, stream)
    log = structlog.get_logger("egress.test")
    try:
        fail_with_a_secret_in_a_local()
    except RuntimeError:
        log.exception(
            "request failed",
            headers={"Authorization": f"Bearer {SECRET}"},
            nats=f"nats://u:{SECRET}@h:4222",
            token=SECRET,
            fencing_token=7,
        )
    logging.getLogger("nats.aio.client").warning("connecting to nats://u:%s@h", SECRET)
    text = stream.getvalue()
    assert SECRET not in text
    assert "RuntimeError: refused (1 headers)" in text  # the traceback is there ...
    assert "fail_with_a_secret_in_a_local" in text
    assert "headers = " not in text  # ... without the frame's locals
    assert "fencing_token" in text
    assert text.count(REDACTED) == 4


def test_secrets_in_an_exception_message_are_scrubbed() -> None:
    for fmt in ("console", "json"):
        stream = io.StringIO()
        configure_logging("info", fmt, stream)
        try:
            raise ConnectionError(f"cannot reach nats://u:{SECRET}@h with Bearer {SECRET}")
        except ConnectionError:
            structlog.get_logger("egress.test").exception("lost")
        assert SECRET not in stream.getvalue(), fmt
        assert "ConnectionError: cannot reach nats://u:" in stream.getvalue()


# ---------------------------------------------------------------------------------- terminal


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("a\rb\nc\td\x07", "a\\rb\\nc\\td\\x07"),
        ("\x9b31m", "\\x9b31m"),
        ("admin\u202e\u2066txt.exe", "admin\\u202e\\u2066txt.exe"),
        ("line\u2028sep", "line\\u2028sep"),
        ("bad\udcff", "bad\\udcff"),
        ("caf\u00e9 \u65e5\u672c [bold]", "caf\u00e9 \u65e5\u672c [bold]"),
    ],
)
def test_printable_spells_out_what_a_terminal_would_act_on(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_printable_multiline_keeps_line_breaks_and_tabs_only() -> None:
    assert printable("a\n\tb\r\x1b", multiline=True) == "a\n\tb\\r\\x1b"


def test_console_lines_cannot_drive_the_terminal_or_forge_a_line() -> None:
    stream = io.StringIO()
    configure_logging("info", "console", stream)
    structlog.get_logger("egress.test").warning(
        "holder \x1b]0;owned\x07", holder="x\n2026-01-01 [error    ] forged", n=1
    )
    text = stream.getvalue()
    assert "\x1b" not in text
    assert "\x07" not in text
    assert text.count("\n") == 1
    assert "\\x1b]0;owned\\x07" in text
    assert "x\\n2026-01-01" in text


def _scrub_every_pattern(text: str) -> str:
    """``scrub`` without its first look: every substitution, always."""
    text = logs._URL_PASSWORD.sub(rf"\1{logs.REDACTED}@", text)
    text = logs._NATS_TOKEN.sub(rf"\1{logs.REDACTED}@", text)
    text = logs._LOGIN_MAC.sub(rf"\1.{logs.REDACTED}", text)
    return logs._BEARER.sub(rf"\1{logs.REDACTED}", text)


_PIECES = st.sampled_from(
    ["://", "nats://", "http://u:", "@", "Bearer ", "bEaReR ", "authorization: ", "=", "x", " "]
)


@given(st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=12).map("".join))
def test_scrub_looks_first_yet_misses_nothing(text: str) -> None:
    assert logs.scrub(text) == _scrub_every_pattern(text)
