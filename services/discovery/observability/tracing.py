"""Server spans and request metrics for the discovery API, as a plain ASGI wrapper.

One SERVER span per request, continuing the caller's trace when it sends ``traceparent``, named
``<METHOD> <route template>`` (``POST /v1/leases``, ``GET /v1/leases/{lease_id}``) once Litestar
has routed the request; a request that matched no route is named by its method alone, so span
names never carry ids. ``/healthz`` and ``/metrics`` are not traced: probes and scrapers would
bury the requests that matter.

It wraps the Litestar app from outside, so the span also covers routing errors (404, 405) and
the body-size check, and everything inside (handler logs, JetStream appends) is its child.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from contextlib import nullcontext
from typing import Any

import structlog
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.discovery.observability.metrics import DiscoveryMetrics
from services.runtime.observability.telemetry import tracer

log = structlog.get_logger("egress.discovery")
_debug = logging.getLogger("egress.discovery")
"""Asked before the per-request debug line: building a structlog event that the level filter
then drops costs more than the rest of this wrapper."""
_tracer = tracer("egress_proxies.discovery")

UNTRACED = ("/healthz", "/metrics")

# Plain ASGI types: the wrapper sees the raw protocol, whatever framework is inside.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


def _untraced() -> bool:
    """No tracer provider was installed: every span would be a no-op."""
    return isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


class TracingMiddleware:
    def __init__(
        self, app: ASGIApp, metrics: DiscoveryMetrics, *, untraced: Iterable[str] = UNTRACED
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.untraced = frozenset(untraced)
        self._labelled: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def _children(self, method: str, route: str, status: int) -> tuple[Any, Any]:
        """The labelled counter and histogram, looked up once per (method, route, status)."""
        key = (method, route, status)
        found = self._labelled.get(key)
        if found is None:
            found = (
                self.metrics.requests.labels(method, route, str(status)),
                self.metrics.request_seconds.labels(method, route),
            )
            self._labelled[key] = found
        return found

    @staticmethod
    def _span(scope: Scope, method: str) -> trace.Span | None:
        """A SERVER span continuing the caller's trace; None when sampling left it invalid."""
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        span = _tracer.start_span(
            method,
            context=propagate.extract(carrier),
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "url.path": scope["path"],
                "url.scheme": scope.get("scheme", "http"),
                "network.protocol.version": scope.get("http_version", "1.1"),
            },
        )
        return span if span.get_span_context().is_valid else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.untraced:
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        status = 500

        async def send_and_see(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        started = time.perf_counter()
        # No SDK installed (tracing off): no carrier, no extract, no span. Even an invalid span
        # costs a tenth of a lease request's API time (docs/benchmarks.md, Discovery API).
        span = None if _untraced() else self._span(scope, method)
        try:
            with trace.use_span(span) if span is not None else nullcontext():
                await self.app(scope, receive, send_and_see)
        finally:
            route = str(scope.get("path_template") or "")
            label = route or "unmatched"
            if span is not None:
                span.update_name(f"{method} {route}" if route else method)
                if route:
                    span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                span.end()  # after the route is known: the name is the route
            elapsed = time.perf_counter() - started
            count, seconds = self._children(method, label, status)
            count.inc()
            seconds.observe(elapsed)
            if _debug.isEnabledFor(logging.DEBUG):
                log.debug(
                    "request",
                    method=method,
                    path=scope["path"],
                    route=label,
                    status=status,
                    ms=round(elapsed * 1000, 2),
                )
