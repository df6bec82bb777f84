"""The console's routes under ``/ui``: server-rendered, read-only pages (docs/console.md).

- ``GET /ui[?phase=&health=&provider=&pool=&egress_country=&attrs=&q=&sort=&order=&page=&size=
  &at=]``: the fleet, a page of it; ``GET /ui/live``: its table alone, which ``console.js``
  fetches every 2 s to update the page without a reload, sending only what changed
  (``pure.fleet_page``)
- ``GET /ui/proxies/{uid}[?at=&range=]``: one proxy, its timeline and its traffic panel
  (``traffic_pages``); ``.../live``: the same, in part, without the panel
- ``GET /ui/clients/{name}[?at=&range=]``: one client's traffic (``traffic_pages``)
- ``GET /ui/pools...``: the pools pages (``pool_pages``)
- ``GET|POST /ui/login``, ``POST /ui/logout``: a client's session (``login``, ``session``)
- ``GET /ui/static/{name}``: the stylesheet and the script, served from the package

Nothing here writes to the log. Every page answers with headers that let it run no script but
its own, be framed by nobody and be cached by nobody, and every error it answers escapes what it
quotes, the parts the script swaps in too. A read of the log is bounded per replica and per
client (429 with ``Retry-After``) and stops when its client goes away
(docs/decisions/0095-the-console-and-the-api-bound.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import urlencode

import structlog
from litestar import MediaType, Request, Response, get
from litestar.datastructures import Cookie
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Redirect
from markupsafe import escape

from events.errors import EventStoreError
from events.subjects import InvalidToken, check_token
from projections.pool import PoolView
from services.discovery.console.fleet_rows import FleetRows
from services.discovery.console.headers import SECURITY_HEADERS
from services.discovery.console.history import Busy, Cost, History
from services.discovery.console.pure.fleet import (
    HEALTHS,
    NO_FILTERS,
    PHASES,
    FilterError,
    Filters,
    counts,
    parse_filters,
    row,
    rows,
)
from services.discovery.console.pure.fleet_page import (
    PAGING,
    SORTS,
    Poll,
    View,
    answer,
    arrange,
    digest,
    parse_poll,
    parse_view,
    where,
)
from services.discovery.console.pure.pools import listed, membership, pool_ref
from services.discovery.console.pure.timeline import merged
from services.discovery.console.render import local_input, page, query
from services.discovery.console.session import Sessions
from services.discovery.pure.egress_shown import shown, shown_in
from services.discovery.views import Views
from services.runtime.eventlog.asof import TooMuchHistory, parse_instant

log = structlog.get_logger("egress.discovery")

STATIC = {"console.css": "text/css; charset=utf-8", "console.js": "text/javascript; charset=utf-8"}
FILES = {name: (resources.files(__package__) / "static" / name).read_bytes() for name in STATIC}
LIVE = Cost(0, 0.0)
AnyRequest = Request[Any, Any, Any]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Console:
    views: Views
    history: History
    session: Sessions
    rows: FleetRows = field(default_factory=FleetRows)
    """The live fleet's rows, rebuilt only where something changed (``fleet_rows``)."""


ConsoleDep = NamedDependency[Console]


class _Refused(Exception):
    """A request the page cannot answer; rendered as an error page with ``status``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


class _Gone(Exception):
    """The client went away while its read of the log ran: nobody is left to answer."""


def _client_key(console: Console, request: AnyRequest) -> str:
    """Whose share of the log reads a request counts in: its client of the clients file (D96),
    however many addresses it comes from; the address where the console is open to all."""
    client = console.session.who(request) if console.session.required else None
    if client is not None and client.name:
        return f"client:{client.name}"
    return "address:" + (request.client.host if request.client is not None else "unknown")


def _html(
    body: str,
    status: int = 200,
    cookies: list[Cookie] | None = None,
    headers: dict[str, str] | None = None,
) -> Response[str]:
    return Response(
        body,
        status_code=status,
        media_type=MediaType.HTML,
        headers={**SECURITY_HEADERS, **(headers or {})},
        cookies=cookies or [],
    )


HEADINGS = {
    400: "Bad request",
    403: "Forbidden",
    404: "Not found",
    422: "Too much history",
    429: "Busy",
    503: "Unavailable",
}


def _error(
    console: Console, status: int, message: str, headers: dict[str, str] | None = None
) -> Response[str]:
    body = page(
        "error.html",
        status=status,
        heading=HEADINGS.get(status, "Error"),
        message=message,
        signed_in=console.session.required,
    )
    return _html(body, status, headers=headers)


def _refused(console: Console, exc: _Refused, *, part: bool = False) -> Response[str]:
    """The error as a whole page, or as the text the script swaps into one (``part``): escaped
    either way, since both are HTML and the message may quote the request."""
    if part:
        return _html(str(escape(str(exc))), exc.status, headers=exc.headers)
    return _error(console, exc.status, str(exc), exc.headers)


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


def _fleet_query(console: Console, request: AnyRequest) -> tuple[datetime | None, Filters, View]:
    at = _at(console, request)
    query_pairs = list(request.query_params.multi_items())
    try:
        return at, parse_filters(query_pairs, allowed=("at", *PAGING)), parse_view(query_pairs)
    except FilterError as exc:
        raise _Refused(400, str(exc)) from None


def _check_pool(filters: Filters, pools: Iterable[PoolView], at: datetime | None) -> None:
    choices = [pool_ref(p) for p in pools]
    if filters.pool and filters.pool not in choices:
        when = " at that time" if at else ""
        known = ", ".join(choices[:10]) + (" ..." if len(choices) > 10 else "")
        hint = f"the pools are {known}" if choices else "there are no pools"
        raise _Refused(400, f"pool: no pool {filters.pool!r}{when}; {hint}")


def _live_rows(console: Console, filters: Filters) -> datetime:
    """Brings the live rows up to date (``fleet_rows``); the instant they are of."""
    now = console.views.now()
    console.rows.sync(console.views, now)
    _check_pool(filters, console.rows.pools, None)
    return now


async def _fleet(console: Console, request: AnyRequest) -> dict[str, Any]:
    at, filters, view = _fleet_query(console, request)
    if at is None:
        now, cost = _live_rows(console, filters), LIVE
        paged, summary = console.rows.listing(filters, view)
    else:
        now = at
        got = await _travel(request, console.history.fleet_at(at, _client_key(console, request)))
        pools = listed(got.pools.values())
        _check_pool(filters, pools, at)
        every = rows(
            got.proxies.values(),
            got.leases,
            at,
            membership(pools),
            policy=console.views.candidates.policy,
        )
        cost = got.cost
        shown = every if filters == NO_FILTERS else [r for r in every if filters.matches(r)]
        summary = counts(shown, every)
        paged = arrange(shown, view, presorted=True)  # both lists come by namespace and name
    kept = filters.query()
    base = [*kept, ("at", local_input(at))]
    order = digest([paged.page, paged.pages, *(r.uid for r in paged.rows)])
    asked = where([*kept, *view.query()])
    poll = Poll(console.rows.instance, console.rows.version, asked, order, digest([summary]))
    return {
        "rows": paged.rows,
        "paged": paged,
        "view": view,
        "sorts": tuple(SORTS),
        "base": base,
        "counts": summary,
        "filters": filters,
        "phases": PHASES,
        "healths": HEALTHS,
        "providers": summary.providers,
        "at": at,
        "now": now,
        "cost": cost,
        "poll": poll if at is None else None,
        "live_url": "/ui/live" + query([*kept, *view.query()]),
        "at_query": query([("at", local_input(at))]),
        "signed_in": console.session.required,
    }


async def _disconnected(request: AnyRequest) -> None:
    """Returns once the client has gone. A GET's body is empty, so after it the server's
    ``receive`` has nothing more to say until the connection closes."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _travel(request: AnyRequest, read: Coroutine[Any, Any, T]) -> T:
    """A read of the log, cancelled when its client goes away (uvicorn would let it run to the
    end for nobody); its failures as pages: busy, too long a history, or NATS away."""
    work = asyncio.ensure_future(read)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            log.info("log read abandoned by its client", path=request.url.path)
            raise _Gone
        return work.result()
    except Busy as exc:
        raise _Refused(429, str(exc), {"Retry-After": str(exc.retry_after)}) from None
    except TooMuchHistory as exc:
        raise _Refused(422, str(exc)) from None
    except EventStoreError as exc:
        raise _Refused(503, f"cannot read the event log: {exc}") from None
    finally:
        gone.cancel()
        work.cancel()


GONE = 499
"""The status logged for a request whose client left before its answer (nginx's number): the
server drops the answer, but a handler returns one."""


async def _proxy(console: Console, request: AnyRequest, uid: str) -> dict[str, Any]:
    try:
        check_token("proxy uid", uid)
    except InvalidToken as exc:
        raise _Refused(404, str(exc)) from None
    at = _at(console, request)
    got = await _travel(request, console.history.proxy(uid, at, _client_key(console, request)))
    if got.proxy is None and got.lease is None:
        when = " at that time" if at else ""
        raise _Refused(404, f"no proxy {uid!r} in the log{when}")
    now = at or console.views.now()
    proxy = got.proxy
    lines, left_out = merged(got.lines)
    title = f"{proxy.namespace}/{proxy.name}" if proxy is not None and proxy.name else uid
    shown_row = None
    if proxy is not None and proxy.name:
        candidates = console.views.candidates
        # Who shares its address is known now (discovery's index), not at a past instant.
        found = (
            shown(proxy, candidates.policy)
            if at is not None
            else shown_in(proxy, candidates.policy, candidates.egress)
        )
        shown_row = row(proxy, got.lease, now, egress=found)
    # An upstream proxy's bytes of today and its provider's budget (D162): discovery's fold of
    # the METER stream, as it is now; a page of a past instant does not show them.
    moved = console.views.bytes_today(proxy) if proxy is not None and at is None else None
    spent = console.views.budget_spent(proxy) if proxy is not None and at is None else None
    return {
        "moved": moved,
        "spent": spent,
        "title": title,
        "proxy": proxy,
        "row": shown_row,
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
        return _refused(console, exc)
    except _Gone:
        return _html("", GONE)


@get("/live")
async def fleet_live(console: ConsoleDep, request: AnyRequest) -> Response[Any]:
    """The table for the page's poll: with ``since`` (the last answer's ``X-Fleet-Poll``),
    204 when nothing changed, or only the rows changed since and the counts."""
    if not console.session.allows(request):
        return _html("log in again", 401)
    try:
        at, filters, view = _fleet_query(console, request)
        if at is None:  # a quiet poll: no row changed since its token, nothing else to read
            now = _live_rows(console, filters)
            before = parse_poll(view.since)
            asked = where([*filters.query(), *view.query()])
            if before is not None and console.rows.quiet(before, asked):
                headers = {
                    "X-Fleet-Now": str(int(now.timestamp() * 1000)),
                    "X-Fleet-Poll": before.token,
                    "X-Fleet-Mode": "nothing",
                }
                return Response(None, status_code=204, headers={**SECURITY_HEADERS, **headers})
        context = await _fleet(console, request)
    except _Refused as exc:
        return _refused(console, exc, part=True)
    except _Gone:
        return _html("", GONE)
    poll: Poll | None = context["poll"]
    headers = {"X-Fleet-Now": str(int(context["now"].timestamp() * 1000))}
    if poll is None:
        return _html(page("_fleet.html", **context), headers={**headers, "X-Fleet-Mode": "full"})
    got = answer(parse_poll(context["view"].since), poll, context["rows"], console.rows.version_of)
    headers |= {"X-Fleet-Poll": poll.token, "X-Fleet-Mode": got.mode}
    if got.mode == "nothing":
        return Response(None, status_code=204, headers={**SECURITY_HEADERS, **headers})
    template = "_fleet_rows.html" if got.mode == "rows" else "_fleet.html"
    return _html(page(template, **context, changed=got.changed), headers=headers)


@get("/proxies/{uid:str}/live")
async def proxy_live(console: ConsoleDep, request: AnyRequest, uid: FromPath[str]) -> Response[Any]:
    if not console.session.allows(request):
        return _html("log in again", 401)
    try:
        return _html(page("_proxy.html", **await _proxy(console, request, uid)))
    except _Refused as exc:
        return _refused(console, exc, part=True)
    except _Gone:
        return _html("", GONE)


@get("/static/{name:str}")
async def static(name: FromPath[str]) -> Response[bytes]:
    if name not in FILES:
        return Response(b"not found", status_code=404, media_type=MediaType.TEXT)
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    return Response(FILES[name], media_type=STATIC[name], headers=headers)


ROUTES = [fleet_page, fleet_live, proxy_live, static]
"""With ``traffic_pages.ROUTES`` (the proxy's page, whose traffic panel is theirs)."""
