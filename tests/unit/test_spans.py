"""Spans skipped only when nothing would record or carry them
(services/runtime/observability/spans.py)."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from services.runtime.observability import spans
from services.runtime.observability.telemetry import configure_tracing, shutdown_tracing, tracer

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
HEADERS = {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"}


def test_with_tracing_off_and_no_trace_to_continue_no_span_is_made() -> None:
    configure_tracing("svc", {}, announce=False)
    built: list[str] = []

    def attributes() -> dict[str, str]:
        built.append("x")
        return {}

    with spans.current(tracer("tests"), "process", attributes=attributes) as span:
        assert span is trace.INVALID_SPAN
        assert not trace.get_current_span().get_span_context().is_valid
    assert built == []  # the attributes were not even built
    shutdown_tracing()


def test_with_tracing_off_a_message_s_trace_is_carried_on() -> None:
    """A service that does not trace still passes its input's trace to what it appends."""
    configure_tracing("svc", {}, announce=False)
    with spans.current(tracer("tests"), "process", context=spans.parent_of(HEADERS)) as span:
        assert not span.is_recording()
        current = trace.get_current_span().get_span_context()
        assert format(current.trace_id, "032x") == TRACE_ID
    shutdown_tracing()


def test_without_a_traceparent_the_span_is_a_root_not_a_child_of_the_current_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_tracing("svc", {"OTEL_TRACES_EXPORTER": "console"}, announce=False)
    with (
        tracer("tests").start_as_current_span("outer") as outer,
        spans.current(tracer("tests"), "process", context=spans.parent_of({})) as span,
    ):
        assert span.is_recording()
        assert span.get_span_context().trace_id != outer.get_span_context().trace_id
    shutdown_tracing()
    capsys.readouterr()


def test_with_tracing_on_every_span_is_recorded(capsys: pytest.CaptureFixture[str]) -> None:
    configure_tracing("svc", {"OTEL_TRACES_EXPORTER": "console"}, announce=False)
    assert spans.recording()
    with spans.current(tracer("tests"), "process", attributes=lambda: {"a": "b"}) as span:
        assert span.is_recording()
    shutdown_tracing()
    assert '"a": "b"' in capsys.readouterr().out
