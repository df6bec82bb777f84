"""Log lines and spans join up (DESIGN §6): every line inside a span names it, exactly once."""

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
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from services.runtime.config import ConfigError
from services.runtime.logs import add_trace_ids, configure_logging

# A local provider: spans become current without installing anything process-wide.
tracer = TracerProvider().get_tracer("tests.logs")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    config = structlog.get_config()
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**config)
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
