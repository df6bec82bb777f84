"""The console's login: the API's token, posted once from a form, kept as a cookie.

A browser cannot send ``Authorization: Bearer`` on a page load, and a token in a URL ends up in
histories, logs and ``Referer`` headers. So the login form posts the token, and the answer sets
an ``HttpOnly``, ``SameSite=Strict`` cookie (``Secure`` over https). The cookie does not hold
the token: it holds an HMAC of a fixed label keyed with it, which opens ``/ui`` on every replica
and after restarts, cannot be used against ``/v1``, and stops working when the token changes.
A request with the API's bearer header is let in too (``curl`` and scripts).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie

COOKIE = "egress_console"
PATH = "/ui"
LABEL = b"egress-proxies console session 1"
MAX_AGE = 12 * 3600
"""A session lasts a working day; the login form is one field."""


class Session:
    def __init__(self, token: str | None) -> None:
        self.token = token
        self._value = hmac.new(token.encode(), LABEL, hashlib.sha256).hexdigest() if token else ""

    @property
    def required(self) -> bool:
        return self.token is not None

    def token_matches(self, given: str) -> bool:
        if self.token is None:
            return True
        return hmac.compare_digest(given.strip().encode(), self.token.encode())

    def allows(self, connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
        if self.token is None:
            return True
        cookie = connection.cookies.get(COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), self._value.encode()):
            return True
        scheme, _, given = connection.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and bool(given.strip()) and self.token_matches(given)

    def cookie(self, *, secure: bool) -> Cookie:
        return Cookie(
            key=COOKIE,
            value=self._value,
            path=PATH,
            max_age=MAX_AGE,
            httponly=True,
            samesite="strict",
            secure=secure,
        )

    @staticmethod
    def cleared() -> Cookie:
        return Cookie(key=COOKIE, value="", path=PATH, max_age=0, httponly=True, samesite="strict")
