"""Client spans and metrics around any provider, so no provider has to remember them
(docs/architecture.md, Telemetry).

This is the outermost layer around a provider: its span covers everything a call costs, retries
and client-side waits included. ``provider.result`` is ``ok`` or the error class, the same value
the ``egress_provider_requests_total{result}`` label takes, so a trace and a dashboard agree
(``cancelled`` when the caller gave up waiting, e.g. at shutdown).
NotFound is a normal answer (the reconciler polls for it after a delete), so its span stays Ok.

An exception outside the taxonomy is a provider bug; it is wrapped into ``Transient`` here (the
original chained and recorded on the span) so callers can rely on the contract: every error is
exactly one of the four classes.

Optional capabilities (``LeftoverCleaner``) are found with ``isinstance``, so the wrapper must
have them exactly when the provider it wraps does: ``instrument`` picks the class that does.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from opentelemetry.trace import SpanKind, Status, StatusCode

from services.providers.base import (
    CreateRequest,
    Instance,
    Leftover,
    LeftoverCleaner,
    NotFound,
    Provider,
    ProviderError,
    Transient,
)
from services.runtime.observability import spans
from services.runtime.observability.metrics import Metrics
from services.runtime.observability.telemetry import tracer

T = TypeVar("T")
OK = "ok"
CANCELLED = "cancelled"

_tracer = tracer("egress.provider")


def instrument(provider: Provider, metrics: Metrics) -> Instrumented:
    """``provider`` wrapped, keeping its optional capabilities (see the module docstring)."""
    if isinstance(provider, LeftoverCleaner):
        return InstrumentedCleaner(provider, metrics)
    return Instrumented(provider, metrics)


class Instrumented:
    """A ``Provider`` that traces and counts every call of the provider it wraps. It has none
    of the optional capabilities; ``instrument`` builds the wrapper that keeps them."""

    def __init__(self, provider: Provider, metrics: Metrics) -> None:
        self.inner = provider
        self.metrics = metrics
        self.name = provider.name
        self.type = provider.type

    async def create(self, request: CreateRequest) -> str:
        return await self._call("create", request.name, lambda: self.inner.create(request))

    async def get(self, provider_id: str) -> Instance:
        return await self._call("get", provider_id, lambda: self.inner.get(provider_id))

    async def delete(self, provider_id: str) -> None:
        await self._call("delete", provider_id, lambda: self.inner.delete(provider_id))

    async def list_by_tag(self) -> list[Instance]:
        return await self._call("list", "", self.inner.list_by_tag)

    async def close(self) -> None:
        await self.inner.close()

    async def _call(self, op: str, target: str, call: Callable[[], Awaitable[T]]) -> T:
        def attributes() -> dict[str, str]:
            named = {"provider.name": self.name, "provider.type": self.type}
            return named | {"provider.instance": target} if target else named

        with spans.current(
            _tracer,
            f"provider.{op}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            started = time.perf_counter()
            result = CANCELLED  # unless the call returns or raises
            try:
                value = await call()
                result = OK
            except NotFound:
                result = NotFound.error_class.value
                span.set_status(Status(StatusCode.OK))
                raise
            except ProviderError as exc:
                result = exc.error_class.value
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{result}: {exc}"))
                raise
            except Exception as exc:
                result = Transient.error_class.value
                span.record_exception(exc)
                span.set_attribute("error.type", type(exc).__qualname__)
                span.set_status(Status(StatusCode.ERROR, f"unclassified: {exc!r}"))
                raise Transient(
                    f"{self.name}: {op} failed with an unclassified {type(exc).__name__}: {exc}"
                ) from exc
            finally:
                span.set_attribute("provider.result", result)
                self.metrics.provider_requests.labels(self.name, op, result).inc()
                self.metrics.provider_seconds.labels(self.name, op).observe(
                    time.perf_counter() - started
                )
            span.set_status(Status(StatusCode.OK))
            return value


class InstrumentedCleaner(Instrumented):
    """``Instrumented`` around a provider that is also a ``LeftoverCleaner``."""

    def __init__(self, provider: Provider, metrics: Metrics) -> None:
        if not isinstance(provider, LeftoverCleaner):
            raise TypeError(f"provider {provider.name!r} cannot clean leftovers; use instrument()")
        super().__init__(provider, metrics)
        self.cleaner: LeftoverCleaner = provider

    async def leftovers(self) -> list[Leftover]:
        return await self._call("leftovers", "", self.cleaner.leftovers)

    async def delete_leftover(self, leftover: Leftover) -> bool:
        return await self._call(
            "delete_leftover",
            leftover.provider_id,
            lambda: self.cleaner.delete_leftover(leftover),
        )
