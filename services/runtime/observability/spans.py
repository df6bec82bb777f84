"""Spans that cost nothing when nothing would record or carry them.

With tracing off, OpenTelemetry's API still makes a span per call: a context attached and
detached, attribute dictionaries built, a no-op span object. On the reconciler's path that was
7 to 10% of its CPU in a profile (docs/benchmarks.md, "Proxy lifecycle"). A span is needed when a
provider records it, or when there is a trace to continue: a no-op span still carries its
parent's context, which is how a trace passes through a service that does not trace itself
(docs/architecture.md, "Telemetry"). Only when neither holds is the span skipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER
from opentelemetry.trace import Span
from opentelemetry.util import types

from services.runtime.observability import telemetry

TRACEPARENT = "traceparent"
_PROVIDER_FROM_ENV = OTEL_PYTHON_TRACER_PROVIDER in os.environ
"""Whether OpenTelemetry would load a provider named by the environment on first use."""

Attributes = Callable[[], types.Attributes]


def recording() -> bool:
    """Whether a span started now would be recorded by a provider (ours or another's)."""
    # The global ``get_tracer_provider`` reads: while none is set, that function looks up an
    # environment variable on every call, a measurable share of a busy service's CPU.
    provider = getattr(trace, "_TRACER_PROVIDER", None)
    if provider is None:
        if not _PROVIDER_FROM_ENV:
            return False
        provider = trace.get_tracer_provider()
    current = telemetry.current_provider(provider)
    return not isinstance(current, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def needed(context: Context | None = None) -> bool:
    """Whether a span in ``context`` (the current one if None) would be recorded or carry a
    trace on."""
    return recording() or trace.get_current_span(context).get_span_context().is_valid


def parent_of(headers: Mapping[str, str]) -> Context:
    """The trace context a message carries (an empty one without: the span is a root, not a
    child of whatever is current), not parsed when there is nothing to parse."""
    return propagate.extract(headers) if TRACEPARENT in headers else Context()


def current(
    tracer: trace.Tracer,
    name: str,
    *,
    context: Context | None = None,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
    attributes: Attributes | None = None,
    record_exception: bool = True,
    set_status_on_exception: bool = True,
) -> AbstractContextManager[Span]:
    """``tracer.start_as_current_span``, or a stand-in yielding the invalid span when the span
    would be neither recorded nor carried on (its attributes are then not even built)."""
    if not needed(context):
        return nullcontext(trace.INVALID_SPAN)
    return tracer.start_as_current_span(
        name,
        context=context,
        kind=kind,
        attributes=attributes() if attributes else None,
        record_exception=record_exception,
        set_status_on_exception=set_status_on_exception,
    )
