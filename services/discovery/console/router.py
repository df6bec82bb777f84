"""The ``/ui`` router: every console page (``routes``, ``pool_pages``) and the session's
(``login``), with the one ``Console`` they share."""

from __future__ import annotations

from litestar import Router
from litestar.di import Provide

from services.discovery.console import pool_pages, routes, traffic_pages
from services.discovery.console.history import History
from services.discovery.console.login import login, login_form, logout
from services.discovery.console.routes import Console
from services.discovery.console.session import Sessions
from services.discovery.views import Views


def console_router(views: Views, sessions: Sessions) -> Router:
    """The ``/ui`` routes, reading ``views`` (live) and the log (time travel, timelines)."""
    console = Console(views, History(views.js), sessions)
    return Router(
        "/ui",
        route_handlers=[
            *routes.ROUTES,
            *pool_pages.ROUTES,
            *traffic_pages.ROUTES,
            login_form,
            login,
            logout,
        ],
        dependencies={
            "console": Provide(lambda: console, sync_to_thread=False),
            "sessions": Provide(lambda: sessions, sync_to_thread=False),
        },
        include_in_schema=False,
    )
