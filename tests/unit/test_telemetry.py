"""The tracing gate (docs/architecture.md, Telemetry) and what each setting really installs.

Exports to a real OTLP endpoint are in tests/integration/test_telemetry_export.py.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.runtime.observability.logs import configure_logging
from services.runtime.observability.telemetry import (
    TracingState,
    configure_tracing,
    current_state,
    reset_for_tests,
    resolve_tracing,
    shutdown_tracing,
    tracer,
)
from services.runtime.settings.errors import ConfigError

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
EXPORTER = "OTEL_TRACES_EXPORTER"
PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
DISABLED = "OTEL_SDK_DISABLED"
SAMPLER = "OTEL_TRACES_SAMPLER"
SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"

# Created before any configuration, like the module-level tracers of the services.
early = trace.get_tracer("tests.telemetry.early")


@pytest.fixture(autouse=True)
def logs() -> Iterator[io.StringIO]:
    """Log lines go here, so standard output holds only what the console exporter prints."""
    root = logging.getLogger()
    handlers, level, config = list(root.handlers), root.level, structlog.get_config()
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    try:
        yield stream
    finally:
        reset_for_tests()
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**config)


# ----------------------------------------------------------------------------- the gate

GATE = [
    ({}, False, "none", "", "none of"),
    ({ENDPOINT: ""}, False, "none", "", "none of"),
    ({ENDPOINT: "http://c:4318"}, True, "otlp/http", "http://c:4318/v1/traces", ENDPOINT),
    ({ENDPOINT: "http://c:4318/"}, True, "otlp/http", "http://c:4318/v1/traces", ENDPOINT),
    ({TRACES_ENDPOINT: "http://c:1/x"}, True, "otlp/http", "http://c:1/x", TRACES_ENDPOINT),
    (
        {ENDPOINT: "http://a:4318", TRACES_ENDPOINT: "https://b/t"},
        True,
        "otlp/http",
        "https://b/t",
        TRACES_ENDPOINT,
    ),
    ({ENDPOINT: "http://c:4317", PROTOCOL: "grpc"}, True, "otlp/grpc", "http://c:4317", ENDPOINT),
    ({ENDPOINT: "c:4317", TRACES_PROTOCOL: "grpc"}, True, "otlp/grpc", "c:4317", ENDPOINT),
    (
        {ENDPOINT: "http://c:4318", PROTOCOL: "grpc", TRACES_PROTOCOL: "http/protobuf"},
        True,
        "otlp/http",
        "http://c:4318/v1/traces",
        ENDPOINT,
    ),
    ({EXPORTER: "otlp"}, True, "otlp/http", "http://localhost:4318/v1/traces", EXPORTER),
    ({EXPORTER: "otlp", PROTOCOL: "grpc"}, True, "otlp/grpc", "http://localhost:4317", EXPORTER),
    ({EXPORTER: "console"}, True, "console", "", "OTEL_TRACES_EXPORTER=console"),
    ({EXPORTER: "Console"}, True, "console", "", "OTEL_TRACES_EXPORTER=console"),
    ({EXPORTER: "console", ENDPOINT: "http://c:4318"}, True, "console", "", "=console"),
    ({EXPORTER: "none", ENDPOINT: "http://c:4318"}, False, "none", "", "OTEL_TRACES_EXPORTER=none"),
    ({DISABLED: "true", ENDPOINT: "http://c:4318"}, False, "none", "", "OTEL_SDK_DISABLED"),
    ({DISABLED: "TRUE", EXPORTER: "console"}, False, "none", "", "OTEL_SDK_DISABLED"),
    ({DISABLED: "true", EXPORTER: "zipkin"}, False, "none", "", "OTEL_SDK_DISABLED"),
    (
        {DISABLED: "false", ENDPOINT: "http://c:4318"},
        True,
        "otlp/http",
        "http://c:4318/v1/traces",
        "",
    ),
]


@pytest.mark.parametrize(("env", "enabled", "exporter", "endpoint", "reason"), GATE)
def test_gate(
    env: dict[str, str], enabled: bool, exporter: str, endpoint: str, reason: str
) -> None:
    state = resolve_tracing("svc", env)
    assert (state.enabled, state.exporter, state.endpoint) == (enabled, exporter, endpoint)
    assert reason in state.reason
    assert state.describe().startswith("tracing on" if enabled else "tracing off")
    assert state.reason in state.describe()


@pytest.mark.parametrize(
    ("env", "sampler"),
    [
        ({}, "parentbased_always_on"),
        ({SAMPLER: "always_off"}, "always_off"),
        ({SAMPLER: "traceidratio", SAMPLER_ARG: "0.25"}, "traceidratio(0.25)"),
        ({SAMPLER: "parentbased_traceidratio"}, "parentbased_traceidratio(1.0)"),
        ({SAMPLER: "ParentBased_Always_Off", SAMPLER_ARG: "0.5"}, "parentbased_always_off"),
    ],
)
def test_sampler_follows_the_environment(env: dict[str, str], sampler: str) -> None:
    state = resolve_tracing("svc", {EXPORTER: "console", **env})
    assert state.sampler == sampler
    assert sampler in state.describe()


def test_service_name_defaults_to_the_service_and_yields_to_otel_service_name() -> None:
    assert resolve_tracing("reconciler", {EXPORTER: "console"}).service_name == "reconciler"
    env = {EXPORTER: "console", "OTEL_SERVICE_NAME": "rec-eu"}
    assert resolve_tracing("reconciler", env).service_name == "rec-eu"


def test_health_probe_tracing_is_part_of_the_state() -> None:
    state = resolve_tracing("health", {EXPORTER: "console"}, trace_health_probes=True)
    assert state.trace_health_probes
    assert not resolve_tracing("health", {EXPORTER: "console"}).trace_health_probes


@pytest.mark.parametrize(
    ("env", "variable", "allowed"),
    [
        ({EXPORTER: "zipkin"}, EXPORTER, "otlp, console, none"),
        ({EXPORTER: "otlp,console"}, EXPORTER, "otlp, console, none"),
        ({ENDPOINT: "http://c:4318", PROTOCOL: "http/json"}, PROTOCOL, "http/protobuf, grpc"),
        ({EXPORTER: "otlp", TRACES_PROTOCOL: "thrift"}, TRACES_PROTOCOL, "http/protobuf, grpc"),
        ({EXPORTER: "console", SAMPLER: "sometimes"}, SAMPLER, "parentbased_always_on"),
        ({EXPORTER: "console", SAMPLER: "traceidratio", SAMPLER_ARG: "2"}, SAMPLER_ARG, "0 to 1"),
        ({EXPORTER: "console", SAMPLER: "traceidratio", SAMPLER_ARG: "half"}, SAMPLER_ARG, "0 to"),
        ({ENDPOINT: "collector:4318"}, ENDPOINT, "http://"),
        ({TRACES_ENDPOINT: "ftp://c/v1/traces"}, TRACES_ENDPOINT, "http://"),
        ({ENDPOINT: "ftp://c:4317", PROTOCOL: "grpc"}, ENDPOINT, "http://"),
    ],
)
def test_invalid_values_name_the_variable_and_the_choices(
    env: dict[str, str], variable: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        resolve_tracing("svc", env)
    message = str(raised.value)
    assert message.startswith(f"{variable}:")
    assert allowed in message
    with pytest.raises(ConfigError, match=variable):
        configure_tracing("svc", env)
    assert not current_state().enabled


# --------------------------------------------------------------------- what gets installed


def test_off_installs_nothing_that_records(capsys: pytest.CaptureFixture[str]) -> None:
    state = configure_tracing("svc", {})
    assert not state.enabled
    with tracer("tests").start_as_current_span("ignored") as span:
        assert not span.is_recording()
        assert not trace.get_current_span().get_span_context().is_valid
    shutdown_tracing()
    assert capsys.readouterr().out == ""


def test_console_prints_each_span(capsys: pytest.CaptureFixture[str]) -> None:
    state = configure_tracing("watcher", {EXPORTER: "console"})
    assert state == current_state()
    with tracer("tests").start_as_current_span("Reconcile Proxy") as span:
        assert span.is_recording()
        trace_id = format(span.get_span_context().trace_id, "032x")
    printed = json.loads(capsys.readouterr().out)
    assert printed["name"] == "Reconcile Proxy"
    assert printed["context"]["trace_id"] == f"0x{trace_id}"
    assert printed["resource"]["attributes"]["service.name"] == "watcher"


def test_otel_service_name_reaches_the_resource(capsys: pytest.CaptureFixture[str]) -> None:
    configure_tracing("watcher", {EXPORTER: "console", "OTEL_SERVICE_NAME": "watcher-eu"})
    with tracer("tests").start_as_current_span("named"):
        pass
    printed = json.loads(capsys.readouterr().out)
    assert printed["resource"]["attributes"]["service.name"] == "watcher-eu"


def test_the_sampler_is_the_environments(capsys: pytest.CaptureFixture[str]) -> None:
    configure_tracing("svc", {EXPORTER: "console", SAMPLER: "always_off"})
    with tracer("tests").start_as_current_span("dropped") as span:
        assert not span.is_recording()
    assert capsys.readouterr().out == ""


def test_tracers_taken_early_follow_every_reconfiguration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_tracing("first", {EXPORTER: "console"})
    with early.start_as_current_span("one"):
        pass
    configure_tracing("second", {EXPORTER: "console"})
    with early.start_as_current_span("two"):
        pass
    shutdown_tracing()
    with early.start_as_current_span("three") as span:
        assert not span.is_recording()
    decoder, text, printed = json.JSONDecoder(), capsys.readouterr().out, []
    position = 0
    while text[position:].strip():
        position += len(text[position:]) - len(text[position:].lstrip())
        span_json, position = decoder.raw_decode(text, position)
        printed.append(span_json)
    assert [(p["name"], p["resource"]["attributes"]["service.name"]) for p in printed] == [
        ("one", "first"),
        ("two", "second"),
    ]


def test_one_start_up_line_states_the_effective_state(logs: io.StringIO) -> None:
    state = configure_tracing("discovery", {ENDPOINT: "http://c:4318", SAMPLER: "always_on"})
    shutdown_tracing()
    lines = [json.loads(line) for line in logs.getvalue().splitlines()]
    (line,) = [line for line in lines if line["logger"] == "egress.telemetry"]
    assert line["event"] == "tracing"
    assert line["level"] == "info"
    assert {k: line[k] for k in ("enabled", "exporter", "endpoint", "sampler", "reason")} == {
        "enabled": True,
        "exporter": "otlp/http",
        "endpoint": "http://c:4318/v1/traces",
        "sampler": "always_on",
        "reason": state.reason,
    }


def test_describe_reads_as_one_line() -> None:
    on = TracingState(
        enabled=True,
        exporter="otlp/grpc",
        endpoint="http://c:4317",
        sampler="always_on",
        reason="OTEL_EXPORTER_OTLP_ENDPOINT is set",
        service_name="gc",
    )
    assert on.describe() == (
        "tracing on: otlp/grpc to http://c:4317, sampler always_on, service gc "
        "(OTEL_EXPORTER_OTLP_ENDPOINT is set)"
    )
    assert TracingState(enabled=False, reason="OTEL_SDK_DISABLED=true").describe() == (
        "tracing off (OTEL_SDK_DISABLED=true)"
    )


def test_tests_can_collect_spans_in_memory() -> None:
    exporter = InMemorySpanExporter()
    reset_for_tests(SimpleSpanProcessor(exporter))
    with early.start_as_current_span("status.patch"):
        pass
    assert [span.name for span in exporter.get_finished_spans()] == ["status.patch"]
    reset_for_tests()
    with early.start_as_current_span("after reset"):
        pass
    assert [span.name for span in exporter.get_finished_spans()] == ["status.patch"]
