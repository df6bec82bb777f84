"""The gateway's traffic in the console (docs/console.md, "Traffic";
docs/decisions/0159-traffic-in-the-console.md):

- ``GET /ui/clients/{name}[?range=hour|day&at=]``: one client's traffic by proxy and by host
  over the last hour or day before ``at`` (default now), and a chart of its bytes and requests
  per interval
- ``GET /ui/proxies/{uid}[?at=&range=]``: the proxy's page (``routes._proxy``) with a panel of
  its traffic by client and by lease over the same ranges

Both read the TRAFFIC stream (``traffic_read``: at most ``MAX_RECORDS`` records) with the same
admission as the console's other reads of the log. A client of the clients file sees only its
own traffic; one with the ``admin`` scope, and everyone where the console is open, sees all.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from litestar import Response, get
from litestar.params import FromPath

from events.traffic import client_key, name_problem
from projections import traffic
from projections.traffic import Scope, Totals, TrafficView
from services.discovery.console.pure.traffic import (
    RANGES,
    Range,
    chart,
    parse_range,
    series,
)
from services.discovery.console.render import local_input, page, query
from services.discovery.console.routes import (
    GONE,
    AnyRequest,
    Console,
    ConsoleDep,
    _at,
    _client_key,
    _Gone,
    _html,
    _login_redirect,
    _proxy,
    _Refused,
    _refused,
    _travel,
)
from services.discovery.console.traffic_read import MAX_RECORDS, TrafficRead

SHOWN_ROWS = 50
"""Rows of one table shown; the page says how many more the range holds."""
SHOWN_NAME = 40
"""Characters of a refused name quoted back."""


def _viewer(console: Console, request: AnyRequest) -> str | None:
    """Whose traffic the request may see: None for all (an admin, or an open console), else
    its own client's name."""
    if not console.session.required:
        return None
    client = console.session.who(request)
    if client is None or client.admin:
        return None
    return client.name


def _range(request: AnyRequest) -> Range:
    try:
        return parse_range(request.query_params.get("range", ""))
    except ValueError as exc:
        raise _Refused(400, str(exc)) from None


def _rows(view: TrafficView, by: str) -> tuple[list[tuple[str, str, Totals]], int]:
    """The busiest ``SHOWN_ROWS`` of a table as (key, shown name, totals), and how many more."""
    rows = traffic.table(view, by)
    names = view.proxy_names if by == "proxies" else {}
    shown = [(key, names.get(key, key), sums) for key, sums in rows[:SHOWN_ROWS]]
    return shown, max(0, len(rows) - SHOWN_ROWS)


async def _read(
    console: Console, request: AnyRequest, subject: str, scope: Scope, span: Range
) -> TrafficRead:
    """``scope`` names both ends of the range; the chart covers ``span`` back from its end."""
    got = series(scope.until or console.views.server_now(), span)
    return await _travel(
        request, console.history.traffic(subject, scope, got, _client_key(console, request))
    )


def _common(read: TrafficRead, span: Range, at: datetime | None) -> dict[str, Any]:
    return {
        "view": read.view,
        "span": span,
        "ranges": [
            (r, query([("range", r.name), ("at", local_input(at))])) for r in RANGES.values()
        ],
        "charts": (chart(read.series, "bytes"), chart(read.series, "requests")),
        "since": read.series.since,
        "until": read.view.scope.until,
        "read": read.read,
        "read_ms": round(read.seconds * 1000),
        "max_records": MAX_RECORDS,
    }


async def _client(console: Console, request: AnyRequest, name: str) -> dict[str, Any]:
    if name_problem(name) is not None:
        raise _Refused(
            404, f"no client {name[:SHOWN_NAME]!r}: a client's name is {name_problem(name)}"
        )
    viewer = _viewer(console, request)
    if viewer is not None and viewer != name:
        raise _Refused(
            403, "a client sees only its own traffic (the admin scope sees every client's)"
        )
    span, at = _range(request), _at(console, request)
    end = at or console.views.server_now()
    scope = Scope(since=end - timedelta(seconds=span.seconds), until=end, client=name)
    got = await _read(console, request, f"traffic.{client_key(name)}", scope, span)
    return {
        "traffic": client_traffic(got, span, at),
        "name": name,
        "at": at,
        "action": f"/ui/clients/{quote(name, safe='')}",
        "hidden": [("range", span.name)],
        "at_query": query([("at", local_input(at))]),
        "signed_in": console.session.required,
    }


def client_traffic(got: TrafficRead, span: Range, at: datetime | None) -> dict[str, Any]:
    """The client page's ``traffic``: by proxy and by host."""
    proxies, more_proxies = _rows(got.view, "proxies")
    hosts, more_hosts = _rows(got.view, "hosts")
    return {
        **_common(got, span, at),
        "proxies": proxies,
        "more_proxies": more_proxies,
        "hosts": hosts,
        "more_hosts": more_hosts,
    }


async def _panel(
    console: Console, request: AnyRequest, uid: str, at: datetime | None
) -> dict[str, Any]:
    """The proxy page's traffic. A refusal (too many records, busy, no stream) is shown in the
    panel, and the rest of the page still answers."""
    viewer = _viewer(console, request)
    try:
        span = _range(request)
        end = at or console.views.server_now()
        since = end - timedelta(seconds=span.seconds)
        scope = Scope(since=since, until=end, client=viewer, proxy=uid)
        subject = f"traffic.{client_key(viewer)}" if viewer is not None else "traffic.*"
        got = await _read(console, request, subject, scope, span)
    except _Refused as exc:
        return {"refused": str(exc), "own": viewer}
    return panel(got, span, at, viewer)


def panel(got: TrafficRead, span: Range, at: datetime | None, own: str | None) -> dict[str, Any]:
    """The proxy page's ``traffic``: by client and by lease (``own``: the one client shown)."""
    clients, more_clients = _rows(got.view, "clients")
    leases, more_leases = _rows(got.view, "leases")
    return {
        **_common(got, span, at),
        "refused": "",
        "own": own,
        "clients": clients,
        "more_clients": more_clients,
        "leases": leases,
        "more_leases": more_leases,
    }


@get("/clients/{name:str}")
async def client_page(
    console: ConsoleDep, request: AnyRequest, name: FromPath[str]
) -> Response[Any]:
    if not console.session.allows(request):
        return _login_redirect(request)
    try:
        return _html(page("client.html", **await _client(console, request, name)))
    except _Refused as exc:
        return _refused(console, exc)
    except _Gone:
        return _html("", GONE)


@get("/proxies/{uid:str}")
async def proxy_page(console: ConsoleDep, request: AnyRequest, uid: FromPath[str]) -> Response[Any]:
    if not console.session.allows(request):
        return _login_redirect(request)
    try:
        context = await _proxy(console, request, uid)
        panel = await _panel(console, request, uid, context["at"])
        return _html(page("proxy.html", **context, traffic=panel))
    except _Refused as exc:
        return _refused(console, exc)
    except _Gone:
        return _html("", GONE)


ROUTES = [client_page, proxy_page]
