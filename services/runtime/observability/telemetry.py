"""OpenTelemetry tracing, switched on only by the standard ``OTEL_*`` variables
(docs/architecture.md, Telemetry).

Tracing stays off unless an OTLP endpoint or ``OTEL_TRACES_EXPORTER`` is set, so a laptop run never
tries to reach a collector that is not there. A value we do not understand fails start-up with the
variable named, like every other setting: a typo would otherwise silently lose every trace.

Every variable that decides *what* is exported (exporter, protocol, endpoint, sampler, service
name) is read from the one mapping the caller passes, so the start-up line can never disagree with
what is installed. The SDK's own tuning knobs (``OTEL_BSP_*``, exporter headers, timeouts,
certificates) are left to the SDK, which reads them from the process environment.

Why a switchable provider: OpenTelemetry lets the global TracerProvider be set once per process,
and the API's proxy tracers (``trace.get_tracer`` at import time, as the JetStream store does)
keep the first real tracer they obtain. Replacing the global provider would therefore leave
those module-level tracers writing to the old one. Instead the global provider is a thin switch,
installed once, whose tracers look up the current SDK provider on every span; configuring again
(or ``reset_for_tests``) swaps the SDK provider behind it, resource and sampler included.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, TextIO
from urllib.parse import urlparse

import structlog
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, sampling
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

from services.runtime.settings.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span
    from opentelemetry.util import types

    # The API types start_as_current_span with this private class; only the annotation uses it.
    from opentelemetry.util._decorator import _AgnosticContextManager

log = structlog.get_logger("egress.telemetry")

EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")
# The SDK's samplers under the SDK's names; the argument is the ratio, where one applies.
_SAMPLERS: dict[str, Callable[[float], sampling.Sampler]] = {
    "always_on": lambda _: sampling.ALWAYS_ON,
    "always_off": lambda _: sampling.ALWAYS_OFF,
    "traceidratio": sampling.TraceIdRatioBased,
    "parentbased_always_on": lambda _: sampling.DEFAULT_ON,
    "parentbased_always_off": lambda _: sampling.DEFAULT_OFF,
    "parentbased_traceidratio": sampling.ParentBasedTraceIdRatio,
}
_RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")
_DEFAULT_HTTP_ENDPOINT = "http://localhost:4318/v1/traces"
_DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
_GATES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
)


@dataclass(frozen=True, slots=True)
class TracingState:
    """The effective tracing set-up, as reported once at start-up."""

    enabled: bool
    exporter: str = "none"
    endpoint: str = ""
    sampler: str = ""
    reason: str = ""
    service_name: str = ""
    trace_health_probes: bool = False

    def describe(self) -> str:
        if not self.enabled:
            return f"tracing off ({self.reason})"
        where = f" to {self.endpoint}" if self.endpoint else ""
        return (
            f"tracing on: {self.exporter}{where}, sampler {self.sampler}, "
            f"service {self.service_name} ({self.reason})"
        )


def _get(env: Mapping[str, str], name: str) -> str:
    """An empty variable counts as unset, as the specification says."""
    return env.get(name, "").strip()


def resolve_tracing(
    service_name: str,
    env: Mapping[str, str] | None = None,
    *,
    trace_health_probes: bool = False,
) -> TracingState:
    """Decide the tracing state from the environment without installing anything.

    Separate from ``configure_tracing`` so the gate can be checked (and tested) on its own.
    """
    env = os.environ if env is None else env
    if _get(env, "OTEL_SDK_DISABLED").lower() == "true":
        return TracingState(enabled=False, reason="OTEL_SDK_DISABLED=true")
    exporter = _get(env, "OTEL_TRACES_EXPORTER").lower()
    if exporter and exporter not in EXPORTERS:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER: {exporter!r} is not supported; "
            f"use one of {', '.join(EXPORTERS)}"
        )
    if exporter == "none":
        return TracingState(enabled=False, reason="OTEL_TRACES_EXPORTER=none")
    if not any(_get(env, name) for name in _GATES):
        return TracingState(enabled=False, reason=f"none of {', '.join(_GATES)} is set")
    base = TracingState(
        enabled=True,
        sampler=_sampler_name(env),
        service_name=_get(env, "OTEL_SERVICE_NAME") or service_name,
        trace_health_probes=trace_health_probes,
    )
    if exporter == "console":
        return replace(base, exporter="console", reason="OTEL_TRACES_EXPORTER=console")
    protocol, endpoint, reason = _otlp_target(env)
    return replace(
        base,
        exporter="otlp/grpc" if protocol == "grpc" else "otlp/http",
        endpoint=endpoint,
        reason=reason,
    )


def _otlp_target(env: Mapping[str, str]) -> tuple[str, str, str]:
    """Protocol, full traces endpoint and which variable chose it."""
    protocol_var = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    if not _get(env, protocol_var):
        protocol_var = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = _get(env, protocol_var).lower() or "http/protobuf"
    if protocol not in PROTOCOLS:
        raise ConfigError(
            f"{protocol_var}: {protocol!r} is not supported; use one of {', '.join(PROTOCOLS)}"
        )
    grpc = protocol == "grpc"
    var = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    endpoint = _get(env, var)
    if not endpoint:
        var = "OTEL_EXPORTER_OTLP_ENDPOINT"
        base = _get(env, var)
        if not base:
            default = _DEFAULT_GRPC_ENDPOINT if grpc else _DEFAULT_HTTP_ENDPOINT
            return protocol, default, "OTEL_TRACES_EXPORTER=otlp, default endpoint"
        # The generic endpoint is a base URL: over HTTP each signal appends its own path.
        endpoint = base if grpc else base.rstrip("/") + "/v1/traces"
    url = urlparse(endpoint)
    if (not grpc or "://" in endpoint) and (url.scheme not in ("http", "https") or not url.netloc):
        raise ConfigError(
            f"{var}: {endpoint!r} is not an OTLP endpoint; use e.g. "
            f"{_DEFAULT_GRPC_ENDPOINT if grpc else 'http://collector:4318'}"
        )
    return protocol, endpoint, f"{var} is set"


def _sampler_choice(env: Mapping[str, str]) -> tuple[str, float | None]:
    name = _get(env, "OTEL_TRACES_SAMPLER").lower() or "parentbased_always_on"
    if name not in _SAMPLERS:
        raise ConfigError(
            f"OTEL_TRACES_SAMPLER: {name!r} is not supported; use one of {', '.join(_SAMPLERS)}"
        )
    return name, _ratio(env) if name in _RATIO_SAMPLERS else None


def _sampler_name(env: Mapping[str, str]) -> str:
    name, ratio = _sampler_choice(env)
    return name if ratio is None else f"{name}({ratio})"


def _ratio(env: Mapping[str, str]) -> float:
    raw = _get(env, "OTEL_TRACES_SAMPLER_ARG")
    if not raw:
        return 1.0
    try:
        ratio = float(raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(
            f"OTEL_TRACES_SAMPLER_ARG: {raw!r} is not a sampling ratio; use a number from 0 to 1"
        )
    return ratio


def _sampler(env: Mapping[str, str]) -> sampling.Sampler:
    """Built from the mapping the gate read, so the sampler is the one the start-up line names."""
    name, ratio = _sampler_choice(env)
    return _SAMPLERS[name](1.0 if ratio is None else ratio)


def _exporter(
    state: TracingState, console: TextIO | None = None, timeout: float | None = None
) -> SpanExporter:
    # The OTLP exporters are imported only when chosen: the gRPC one pulls in grpcio.
    if state.exporter == "console":
        return ConsoleSpanExporter(service_name=state.service_name, out=console or sys.stdout)
    if state.exporter == "otlp/grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415 - lazy, see above
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=state.endpoint, timeout=timeout)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415 - lazy, see above
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=state.endpoint, timeout=timeout)


# ------------------------------------------------------------------------------ the switch


class _Switch(trace.TracerProvider):
    """The global provider, set once; it forwards to whichever SDK provider is current."""

    def __init__(self) -> None:
        # One tuple, replaced whole, so a reader never pairs a generation with another provider.
        self.current: tuple[int, trace.TracerProvider] = (0, trace.NoOpTracerProvider())

    def swap(self, provider: trace.TracerProvider) -> None:
        self.current = (self.current[0] + 1, provider)

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: types.Attributes = None,
    ) -> trace.Tracer:
        return _SwitchedTracer(
            self, instrumenting_module_name, instrumenting_library_version, schema_url, attributes
        )


class _SwitchedTracer(trace.Tracer):
    """Resolves the real tracer per span, cached until the switch moves."""

    def __init__(
        self,
        switch: _Switch,
        name: str,
        version: str | None,
        schema_url: str | None,
        attributes: types.Attributes,
    ) -> None:
        self._switch = switch
        self._scope = (name, version, schema_url, attributes)
        self._cached: tuple[int, trace.Tracer] = (-1, trace.NoOpTracer())

    def _real(self) -> trace.Tracer:
        generation, provider = self._switch.current
        cached_generation, tracer = self._cached
        if cached_generation != generation:
            tracer = provider.get_tracer(*self._scope)
            self._cached = (generation, tracer)
        return tracer

    def start_span(  # noqa: PLR0917 - the signature is the API's Tracer.start_span
        self,
        name: str,
        context: Context | None = None,
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> Span:
        return self._real().start_span(
            name,
            context,
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
        )

    def start_as_current_span(  # noqa: PLR0917 - the signature is the API's own
        self,
        name: str,
        context: Context | None = None,
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> _AgnosticContextManager[Span]:
        return self._real().start_as_current_span(
            name,
            context,
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
            end_on_exit,
        )


class _Runtime:
    """The module's mutable handles, in one place (and under one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.switch: _Switch | None = None
        self.provider: SDKTracerProvider | None = None
        self.state = TracingState(enabled=False, reason="not configured")

    def install(self, provider: SDKTracerProvider | None) -> None:
        """Put ``provider`` (or nothing) behind the switch, then flush and stop the previous one."""
        with self.lock:
            if provider is not None and self.switch is None:
                if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
                    provider.shutdown()
                    raise RuntimeError(
                        "another TracerProvider was installed before configure_tracing; "
                        "remove it so this process's spans are exported as configured"
                    )
                self.switch = _Switch()
                trace.set_tracer_provider(self.switch)
                atexit.register(shutdown_tracing)
            previous, self.provider = self.provider, provider
            if self.switch is not None:
                self.switch.swap(provider or trace.NoOpTracerProvider())
        if previous is not None:
            previous.shutdown()


_runtime = _Runtime()


def current_provider(provider: trace.TracerProvider) -> trace.TracerProvider:
    """The provider behind ``provider``: the one our switch forwards to, else itself."""
    return provider.current[1] if isinstance(provider, _Switch) else provider


def configure_tracing(
    service_name: str,
    env: Mapping[str, str] | None = None,
    *,
    trace_health_probes: bool = False,
    announce: bool = True,
    console: TextIO | None = None,
    export_timeout: float | None = None,
) -> TracingState:
    """Install tracing as the environment asks and log the outcome once (not without
    ``announce``: a one-shot command's output is its answer).

    Calling it again replaces the previous set-up (its spans are flushed first). ``console``:
    where the console exporter prints (standard output unless given). ``export_timeout``: the
    longest an export may take, retries included, unless ``OTEL_EXPORTER_OTLP_TIMEOUT`` says
    otherwise (the exporter's own default, 10 s, otherwise).
    """
    env = os.environ if env is None else env
    state = resolve_tracing(service_name, env, trace_health_probes=trace_health_probes)
    provider: SDKTracerProvider | None = None
    if state.enabled:
        timeout = None if _get(env, "OTEL_EXPORTER_OTLP_TIMEOUT") else export_timeout
        exporter = _exporter(state, console, timeout)
        # Printing is for a person watching: show each span as it ends, not in batches.
        printing = state.exporter == "console"
        processor = SimpleSpanProcessor(exporter) if printing else BatchSpanProcessor(exporter)
        provider = _provider(state.service_name, _sampler(env), processor)
    _runtime.install(provider)
    _runtime.state = state
    if announce:
        log.info("tracing", **asdict(state))
    return state


def _provider(
    service_name: str, sampler: sampling.Sampler, processor: SpanProcessor
) -> SDKTracerProvider:
    # Our own atexit hook shuts down whichever provider is current; one per provider would pile up.
    provider = SDKTracerProvider(
        resource=Resource.create({SERVICE_NAME: service_name}),
        sampler=sampler,
        shutdown_on_exit=False,
    )
    provider.add_span_processor(processor)
    return provider


def current_state() -> TracingState:
    """What the last ``configure_tracing`` decided (services ask it about health-probe spans)."""
    return _runtime.state


def shutdown_tracing() -> None:
    """Flush and stop the installed provider; spans started afterwards are dropped. Idempotent."""
    _runtime.install(None)


def reset_for_tests(processor: SpanProcessor | None = None) -> None:
    """Forget the current set-up; with ``processor``, record every span into it instead.

    Tests use the processor form to collect spans in memory (e.g. an ``InMemorySpanExporter``
    behind a ``SimpleSpanProcessor``) without touching the environment.
    """
    provider = None if processor is None else _provider("tests", sampling.ALWAYS_ON, processor)
    _runtime.install(provider)
    _runtime.state = TracingState(enabled=processor is not None, reason="reset for tests")


def tracer(name: str) -> trace.Tracer:
    """A tracer that follows every later (re)configuration, safe to create at import time."""
    return trace.get_tracer(name)
