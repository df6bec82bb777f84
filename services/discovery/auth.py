"""Bearer-token authentication for the ``/v1`` routes.

With ``DISCOVERY_TOKEN`` set, every ``/v1`` request must carry ``Authorization: Bearer <token>``;
the comparison is constant-time. Without it the API serves everyone, and the service says so
loudly at start-up. ``/healthz``, ``/metrics`` and the OpenAPI schema are always open: probes,
scrapers and documentation readers hold no token.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard

TOKEN_ENV = "DISCOVERY_TOKEN"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="egress-proxies"'}


def token_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The configured token; an empty or blank variable counts as unset."""
    env = os.environ if env is None else env
    token = env.get(TOKEN_ENV, "").strip()
    return token or None


def bearer_guard(token: str) -> Guard:
    expected = token.encode()

    def require_token(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        header = connection.headers.get("authorization", "")
        scheme, _sep, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise NotAuthorizedException(
                "this API needs `Authorization: Bearer <token>`", headers=CHALLENGE
            )
        if not hmac.compare_digest(given.strip().encode(), expected):
            raise NotAuthorizedException("the bearer token is not valid", headers=CHALLENGE)

    return require_token
