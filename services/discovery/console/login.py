"""``GET|POST /ui/login`` and ``POST /ui/logout``: a client's console session (``session``).

Both posts are refused unless the browser says the form came from this origin (``Origin``, or
``Sec-Fetch-Site: same-origin``): another site cannot log a visitor out, nor into a session of
its own choosing.

Failed logins are limited per client address (an IPv6 address's /64), as the connection gives
it: ``X-Forwarded-For`` counts only from ``--trusted-proxies``, so a caller cannot claim a fresh
address per guess. A correct token always logs in, throttled or not: a token is 32 random bytes
or more, so the limit was never what stops guessing (the API answers bearer tokens at full
speed), and a limit that refused the right token let anyone who shares the owner's address, or
the reverse proxy's, lock the owner out. What the limit bounds is what failures cost: beyond it,
a wrong token is answered 429 and not logged one by one, per address and over all addresses
(docs/decisions/0135-counters-that-hold.md).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qsl

import structlog
from litestar import MediaType, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.response import Redirect

from services.discovery.console.headers import SECURITY_HEADERS
from services.discovery.console.render import page
from services.discovery.console.session import Sessions
from services.discovery.http.limits import address_group

log = structlog.get_logger("egress.discovery.console")

AnyRequest = Request[Any, Any, Any]
SessionsDep = NamedDependency[Sessions]
MAX_FORM_BYTES = 8192


def _safe_next(value: str) -> str:
    """Only a console path: a login must not send the browser anywhere else."""
    ok = value.startswith("/ui") and not value.startswith("/ui/login") and "//" not in value
    return value if ok and "\\" not in value else "/ui"


def same_origin(request: AnyRequest) -> bool:
    """Whether a form post came from a page of this console, as the browser states it."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site == "same-origin"
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.url.netloc}"
    forwarded = request.headers.get("x-forwarded-proto")
    alternatives = {own} | ({f"{forwarded}://{request.url.netloc}"} if forwarded else set())
    return origin is not None and origin in alternatives


def _form(target: str, error: str, status: int, **headers: str) -> Response[str]:
    return Response(
        page("login.html", next=target, error=error, signed_in=False),
        status_code=status,
        media_type=MediaType.HTML,
        headers={**SECURITY_HEADERS, **headers},
    )


@get("/login")
async def login_form(sessions: SessionsDep, request: AnyRequest) -> Response[Any]:
    target = _safe_next(request.query_params.get("next", "/ui"))
    if not sessions.required:
        return Redirect(target, status_code=303)
    return _form(target, "", 200)


@post("/login", status_code=303)
async def login(sessions: SessionsDep, request: AnyRequest) -> Response[Any]:
    raw = (await request.body())[:MAX_FORM_BYTES]
    form = dict(parse_qsl(raw.decode("utf-8", "replace")))
    target = _safe_next(form.get("next", "/ui"))
    if not same_origin(request):
        return _form(target, "Log in from this console's own page.", 403)
    address = address_group(request.client.host) if request.client else "unknown"
    client = sessions.login(form.get("token", ""))
    if client is None:
        wait = sessions.failed_login(address, time.monotonic())
        if wait > 0:
            message = f"Too many failed logins; try again in {int(wait) + 1} s."
            return _form(target, message, 429, **{"Retry-After": str(int(wait) + 1)})
        return _form(target, "That token is not valid.", 401)
    if not sessions.ready:
        message = "Sessions cannot be signed yet (the event log is out of reach); try again soon."
        return _form(target, message, 503, **{"Retry-After": "2"})
    log.info("console login", client=client.name, client_address=address)
    secure = request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"
    return Redirect(
        target,
        status_code=303,
        cookies=[sessions.cookie(client, secure=secure)],
        headers=SECURITY_HEADERS,
    )


@post("/logout", status_code=303)
async def logout(sessions: SessionsDep, request: AnyRequest) -> Response[Any]:
    if not same_origin(request):
        return _form("/ui", "Log out from this console's own page.", 403)
    client = sessions.who(request)
    if client is not None and client.name:
        await sessions.logout(client)
        log.info("console logout", client=client.name)
    return Redirect("/ui/login", status_code=303, cookies=[sessions.cleared()])
