"""Instrumented: one client span and one metric sample per provider call, whatever the outcome."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from events.schemas import ProxySpec
from services.providers.base import (
    CreateRequest,
    Instance,
    NotFound,
    Permanent,
    QuotaExceeded,
    Transient,
)
from services.providers.instrumented import Instrumented
from services.runtime.observability.metrics import Metrics
from services.runtime.observability.telemetry import tracer
from services.testing.provider import FakeProvider
from tests.contract.provider import MakeRequest, ProviderContract, Provoke, request_factory
from tests.support.waiting import until

REQUEST = CreateRequest(
    name="i1", owner_uid="u1", namespace="default", proxy_name="p", spec=ProxySpec(provider="f")
)


@pytest.fixture
def exporter(spans: InMemorySpanExporter) -> InMemorySpanExporter:
    return spans


@pytest.fixture
def fake() -> FakeProvider:
    return FakeProvider("f", pending_polls=1)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def wrapped(fake: FakeProvider, metrics: Metrics) -> Instrumented:
    return Instrumented(fake, metrics)


def requests(metrics: Metrics, op: str, result: str) -> float:
    value = metrics.registry.get_sample_value(
        "egress_provider_requests_total", {"provider": "f", "op": op, "result": result}
    )
    return value or 0.0


def only_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    spans = exporter.get_finished_spans()
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


class TestInstrumentedContract(ProviderContract):
    """Wrapping must not change what the provider answers."""

    ready_timeout = 5.0

    @pytest.fixture
    def provider(self, wrapped: Instrumented) -> Instrumented:
        return wrapped

    @pytest.fixture
    def make_request(self) -> MakeRequest:
        return request_factory("f")

    @pytest.fixture
    def provoke(self, fake: FakeProvider, wrapped: Instrumented) -> Provoke:
        fake.inject("list", QuotaExceeded("quota"))
        fake.inject("get", KeyError("bug"))  # type: ignore[arg-type]  # a provider bug
        return [("list", wrapped.list_by_tag), ("get", lambda: wrapped.get("fake-x"))]


async def test_success_is_an_ok_client_span_and_a_sample(
    exporter: InMemorySpanExporter, wrapped: Instrumented, metrics: Metrics
) -> None:
    assert (wrapped.name, wrapped.type) == ("f", "fake")
    assert await wrapped.create(REQUEST) == "fake-i1"
    span = only_span(exporter)
    assert span.name == "provider.create"
    assert span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.OK
    assert dict(span.attributes or {}) == {
        "provider.name": "f",
        "provider.type": "fake",
        "provider.instance": "i1",
        "provider.result": "ok",
    }
    assert requests(metrics, "create", "ok") == 1
    count = metrics.registry.get_sample_value(
        "egress_provider_request_seconds_count", {"provider": "f", "op": "create"}
    )
    assert count == 1


async def test_not_found_is_a_normal_answer(
    exporter: InMemorySpanExporter, wrapped: Instrumented, metrics: Metrics
) -> None:
    with pytest.raises(NotFound):
        await wrapped.get("fake-none")
    span = only_span(exporter)
    assert span.name == "provider.get"
    assert span.status.status_code is StatusCode.OK
    assert (span.attributes or {})["provider.result"] == "NotFound"
    assert span.events == ()
    assert requests(metrics, "get", "NotFound") == 1


@pytest.mark.parametrize(
    ("error", "result"),
    [
        (Transient("slow"), "Transient"),
        (Permanent("no"), "Permanent"),
        (QuotaExceeded("q"), "QuotaExceeded"),
    ],
)
async def test_errors_mark_the_span_and_count_by_class(
    exporter: InMemorySpanExporter,
    fake: FakeProvider,
    metrics: Metrics,
    error: Exception,
    result: str,
) -> None:
    wrapped = Instrumented(fake, metrics)
    fake.inject("delete", error)  # type: ignore[arg-type]  # every case is a ProviderError
    with pytest.raises(type(error)):
        await wrapped.delete("fake-i1")
    span = only_span(exporter)
    assert span.name == "provider.delete"
    assert span.status.status_code is StatusCode.ERROR
    assert result in (span.status.description or "")
    assert (span.attributes or {})["provider.result"] == result
    assert [e.name for e in span.events] == ["exception"]
    assert requests(metrics, "delete", result) == 1
    assert requests(metrics, "delete", "ok") == 0


async def test_an_unclassified_error_becomes_transient_with_its_cause(
    exporter: InMemorySpanExporter, fake: FakeProvider, wrapped: Instrumented, metrics: Metrics
) -> None:
    fake.inject("list", RuntimeError("boom"))  # type: ignore[arg-type]  # a provider bug
    with pytest.raises(Transient, match="unclassified RuntimeError: boom") as caught:
        await wrapped.list_by_tag()
    assert isinstance(caught.value.__cause__, RuntimeError)
    span = only_span(exporter)
    assert span.name == "provider.list"
    assert "provider.instance" not in (span.attributes or {})
    assert (span.attributes or {})["error.type"] == "RuntimeError"
    assert span.status.status_code is StatusCode.ERROR
    assert requests(metrics, "list", "Transient") == 1


async def test_span_is_a_child_of_the_callers_span(
    exporter: InMemorySpanExporter, wrapped: Instrumented
) -> None:
    with tracer("tests").start_as_current_span("reconcile.managed") as parent:
        await wrapped.create(REQUEST)
        instance: Instance = await wrapped.get("fake-i1")
    assert instance.provider_id == "fake-i1"
    spans = {s.name: s for s in exporter.get_finished_spans()}
    for name in ("provider.create", "provider.get"):
        context = spans[name].parent
        assert context is not None
        assert context.span_id == parent.get_span_context().span_id


async def test_cancelled_call_is_counted_as_cancelled(
    exporter: InMemorySpanExporter, metrics: Metrics
) -> None:
    slow = FakeProvider("f", latency=10.0)
    wrapped = Instrumented(slow, metrics)
    task = asyncio.create_task(wrapped.get("fake-i1"))
    await until(lambda: slow.calls, what="the call under way")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (only_span(exporter).attributes or {})["provider.result"] == "cancelled"
    assert requests(metrics, "get", "cancelled") == 1


async def test_close_reaches_the_provider(fake: FakeProvider, wrapped: Instrumented) -> None:
    await wrapped.close()
    assert fake.closed
