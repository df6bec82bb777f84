"""The console's routes under ``/ui``: server-rendered, read-only pages (docs/console.md).

- ``GET /ui[?phase=&health=&provider=&attrs=&at=]``: the fleet; ``GET /ui/live``: its table
  alone, which ``console.js`` fetches every 2 s to update the page without a reload
- ``GET /ui/proxies/{uid}[?at=]``: one proxy and its timeline; ``.../live``: the same, in part
- ``GET|POST /ui/login``, ``POST /ui/logout``: the session when ``DISCOVERY_TOKEN`` is set
- ``GET /ui/static/{name}``: the stylesheet and the script, served from the package

Nothing here writes to the log. Every page answers with headers that let it run no script but
its own, be framed by nobody and be cached by nobody.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode

from litestar import MediaType, Request, Response, Router, get, post
from litestar.datastructures import Cookie
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath
from litestar.response import Redirect

from events.errors import EventStoreError
from events.subjects import InvalidToken, check_token
from services.discovery.console.fleet import (
    HEALTHS,
    PHASES,
    FilterError,
    counts,
    parse_filters,
    row,
    rows,
)
from services.discovery.console.history import Cost, History
from services.discovery.console.render import local_input, page, query
from services.discovery.console.session import Session
from services.discovery.console.timeline import merged
from services.discovery.views import Views
from services.runtime.eventlog.asof import TooMuchHistory, parse_instant

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
STATIC = {"console.css": "text/css; charset=utf-8", "console.js": "text/javascript; charset=utf-8"}
FILES = {name: (resources.files(__package__) / "static" / name).read_bytes() for name in STATIC}
LIVE = Cost(0, 0.0)
AnyRequest = Request[Any, Any, Any]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Console:
    views: Views
    history: History
    session: Session


ConsoleDep = NamedDependency[Console]


class _Refused(Exception):
    """A request the page cannot answer; rendered as an error page with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _html(body: str, status: int = 200, cookies: list[Cookie] | None = None) -> Response[str]:
    return Response(
        body,
        status_code=status,
        media_type=MediaType.HTML,
        headers=SECURITY_HEADERS,
        cookies=cookies or [],
    )


def _error(console: Console, status: int, message: str) -> Response[str]:
    headings = {400: "Bad request", 404: "Not found", 422: "Too much history", 503: "Unavailable"}
    body = page(
        "error.html",
        status=status,
        heading=headings.get(status, "Error"),
        message=message,
        signed_in=console.session.required,
    )
    return _html(body, status)


def _next(request: AnyRequest) -> str:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return target if target.startswith("/ui") else "/ui"


def _login_redirect(request: AnyRequest) -> Response[Any]:
    return Redirect("/ui/login?" + urlencode({"next": _next(request)}), status_code=303)


def _at(console: Console, request: AnyRequest) -> datetime | None:
    text = request.query_params.get("at", "").strip()
    if not text:
        return None
    try:
        at = parse_instant(text)
    except ValueError as exc:
        raise _Refused(400, str(exc)) from None
    if at > console.views.server_now():
        raise _Refused(400, f"at: {text[:40]!r} is in the future; leave it empty for now")
    return at


async def _fleet(console: Console, request: AnyRequest) -> dict[str, Any]:
    at = _at(console, request)
    try:
        filters = parse_filters(request.query_params.multi_items(), allowed=("at",))
    except FilterError as exc:
        raise _Refused(400, str(exc)) from None
    if at is None:
        now, cost = console.views.now(), LIVE
        every = rows(console.views.all_proxies(), console.views.leases.views, now)
    else:
        now = at
        got = await _travel(console.history.fleet_at(at))
        every, cost = rows(got.proxies.values(), got.leases, at), got.cost
    shown = [r for r in every if filters.matches(r)]
    summary = counts(shown, every)
    return {
        "rows": shown,
        "counts": summary,
        "filters": filters,
        "phases": PHASES,
        "healths": HEALTHS,
        "providers": summary.providers,
        "at": at,
        "now": now,
        "cost": cost,
        "live_url": "/ui/live" + query(filters.query()),
        "at_query": query([("at", local_input(at))]),
        "signed_in": console.session.required,
    }


async def _travel(read: Awaitable[T]) -> T:
    """A read of the log, its failures as pages: too long a history, or NATS away."""
    try:
        got = await read
    except TooMuchHistory as exc:
        raise _Refused(422, str(exc)) from None
    except EventStoreError as exc:
        raise _Refused(503, f"cannot read the event log: {exc}") from None
    return got


async def _proxy(console: Console, request: AnyRequest, uid: str) -> dict[str, Any]:
    try:
        check_token("proxy uid", uid)
    except InvalidToken as exc:
        raise _Refused(404, str(exc)) from None
    at = _at(console, request)
    got = await _travel(console.history.proxy(uid, at))
    if got.proxy is None and got.lease is None:
        when = " at that time" if at else ""
        raise _Refused(404, f"no proxy {uid!r} in the log{when}")
    now = at or console.views.now()
    proxy = got.proxy
    lines, left_out = merged(got.lines)
    title = f"{proxy.namespace}/{proxy.name}" if proxy is not None and proxy.name else uid
    return {
        "title": title,
        "proxy": proxy,
        "row": row(proxy, got.lease, now) if proxy is not None and proxy.name else None,
        "lines": lines,
        "left_out": left_out,
        "at": at,
        "now": now,
        "cost": got.cost,
        "action": f"/ui/proxies/{uid}",
        "live_url": f"/ui/proxies/{uid}/live",
        "at_query": query([("at", local_input(at))]),
        "signed_in": console.session.required,
    }


# ---------------------------------------------------------------------------------- pages


@get("/")
async def fleet_page(console: ConsoleDep, request: AnyRequest) -> Response[Any]:
    if not console.session.allows(request):
        return _login_redirect(request)
    try:
        return _html(page("fleet.html", **await _fleet(console, request)))
    except _Refused as exc:
        return _error(console, exc.status, str(exc))


@get("/live")
async def fleet_live(console: ConsoleDep, request: AnyRequest) -> Response[Any]:
    if not console.session.allows(request):
        return _html("log in again", 401)
    try:
        return _html(page("_fleet.html", **await _fleet(console, request)))
    except _Refused as exc:
        return _html(str(exc), exc.status)


@get("/proxies/{uid:str}")
async def proxy_page(console: ConsoleDep, request: AnyRequest, uid: FromPath[str]) -> Response[Any]:
    if not console.session.allows(request):
        return _login_redirect(request)
    try:
        return _html(page("proxy.html", **await _proxy(console, request, uid)))
    except _Refused as exc:
        return _error(console, exc.status, str(exc))


@get("/proxies/{uid:str}/live")
async def proxy_live(console: ConsoleDep, request: AnyRequest, uid: FromPath[str]) -> Response[Any]:
    if not console.session.allows(request):
        return _html("log in again", 401)
    try:
        return _html(page("_proxy.html", **await _proxy(console, request, uid)))
    except _Refused as exc:
        return _html(str(exc), exc.status)


# -------------------------------------------------------------------------------- session


def _safe_next(value: str) -> str:
    """Only a console path: a login must not send the browser anywhere else."""
    return value if value.startswith("/ui") and not value.startswith("/ui/login") else "/ui"


@get("/login")
async def login_form(console: ConsoleDep, request: AnyRequest) -> Response[Any]:
    target = _safe_next(request.query_params.get("next", "/ui"))
    if not console.session.required:
        return Redirect(target, status_code=303)
    return _html(page("login.html", next=target, error="", signed_in=False))


@post("/login", status_code=303)
async def login(console: ConsoleDep, request: AnyRequest) -> Response[Any]:
    form = dict(parse_qsl((await request.body()).decode("utf-8", "replace")))
    target = _safe_next(form.get("next", "/ui"))
    if not console.session.token_matches(form.get("token", "")):
        body = page("login.html", next=target, error="That token is not valid.", signed_in=False)
        return _html(body, 401)
    secure = request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"
    return Redirect(
        target,
        status_code=303,
        cookies=[console.session.cookie(secure=secure)],
        headers=SECURITY_HEADERS,
    )


@post("/logout", status_code=303)
async def logout() -> Response[Any]:
    return Redirect("/ui/login", status_code=303, cookies=[Session.cleared()])


@get("/static/{name:str}")
async def static(name: FromPath[str]) -> Response[bytes]:
    if name not in FILES:
        return Response(b"not found", status_code=404, media_type=MediaType.TEXT)
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    return Response(FILES[name], media_type=STATIC[name], headers=headers)


def console_router(views: Views, token: str | None) -> Router:
    """The ``/ui`` routes, reading ``views`` (live) and the log (time travel, timelines)."""
    console = Console(views, History(views.js), Session(token))
    return Router(
        "/ui",
        route_handlers=[
            fleet_page,
            fleet_live,
            proxy_page,
            proxy_live,
            login_form,
            login,
            logout,
            static,
        ],
        dependencies={"console": Provide(lambda: console, sync_to_thread=False)},
        include_in_schema=False,
    )
