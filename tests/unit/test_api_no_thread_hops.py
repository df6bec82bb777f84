"""Every callable Litestar runs per request of the discovery API is a coroutine or declared
``sync_to_thread=False``: Litestar runs any other plain function in its thread pool, a hop per
request that cost a fifth of the API's CPU per lease cycle (docs/benchmarks.md, Discovery API)."""

from __future__ import annotations

from typing import Any

from litestar import Litestar
from litestar.handlers.http_handlers import HTTPRouteHandler
from litestar.utils.sync import AsyncCallable

from services.discovery.http.app import DiscoveryApi, create_app
from services.discovery.leasing.leases import Leases
from services.discovery.observability.metrics import DiscoveryMetrics
from services.discovery.pure.policy import LeasePolicy
from services.discovery.views import Views
from services.runtime.eventlog.memory import InMemoryEventStore
from services.runtime.observability.metrics import Metrics


def _app() -> Litestar:
    store = InMemoryEventStore()
    views = Views(None, store)  # type: ignore[arg-type]  # no JetStream: nothing is read
    metrics = Metrics()
    leases = Leases(store, views, LeasePolicy(), DiscoveryMetrics(metrics.registry))
    return create_app(DiscoveryApi(leases, views, metrics), token="t" * 32)


def _handlers(app: Litestar) -> list[HTTPRouteHandler]:
    found: list[HTTPRouteHandler] = []
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            if isinstance(handler, HTTPRouteHandler):
                found.append(handler)
    return found


def _threaded(hooks: list[Any]) -> list[str]:
    return [repr(getattr(h, "func", h)) for h in hooks if isinstance(h, AsyncCallable)]


def test_no_guard_or_hook_of_any_route_runs_in_the_thread_pool() -> None:
    handlers = _handlers(_app())
    assert len(handlers) > 10, "the app's routes were not found"
    guarded = [h for h in handlers if h.resolve_guards()]
    assert guarded, "no route has the /v1 guard: the check below would prove nothing"
    for handler in handlers:
        hooks: list[Any] = [*handler.resolve_guards()]
        for hook in (
            handler.resolve_before_request(),
            handler.after_request,
            handler.resolve_after_response(),
        ):
            if hook is not None:
                hooks.append(hook)
        assert _threaded(hooks) == [], f"{handler.paths}: run in a thread per request"
        assert not handler.has_sync_callable or not handler.sync_to_thread, handler.paths
        for name, provide in handler.resolve_dependencies().items():
            assert not provide.has_sync_callable or not provide.sync_to_thread, name


def test_the_check_sees_a_plain_function_guard() -> None:
    """The check above can fail: a plain function guard is wrapped for the thread pool."""

    def plain(connection: Any, handler: Any) -> None:
        return None

    async def route() -> None:
        return None

    handler = HTTPRouteHandler(path="/x", http_method="GET", guards=[plain])(route)
    assert _threaded(list(handler.resolve_guards())) != []
