"""``DISCOVERY_TOKEN``: the token of one admin client, for the discovery API and the gateway
(``services.runtime.clients``; the clients file names more).

With a token or a clients file, every ``/v1`` request must carry ``Authorization: Bearer
<token>`` of a client. Without either, the API serves everyone, and the service says so loudly at
start-up. ``/healthz``, ``/metrics`` and the OpenAPI schema are always open: probes, scrapers and
documentation readers hold no token.

The token must be an RFC 6750 ``b64token`` (letters, digits, ``-._~+/``, then ``=`` padding). Any
other character cannot travel in an ``Authorization`` header as it is: a server started with one
would refuse every client, and a client would fail to send it. So both ends refuse it at start-up.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from services.runtime.settings.errors import ConfigError

TOKEN_ENV = "DISCOVERY_TOKEN"
TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~+/-]+=*")


def token_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The configured token; an empty or blank variable counts as unset, and whitespace around
    it (the newline of a file read into the variable) is not part of it."""
    env = os.environ if env is None else env
    token = env.get(TOKEN_ENV, "").strip()
    if token:
        check_token(token)
    return token or None


def check_token(token: str) -> None:
    """Refuse a token that cannot be sent as ``Bearer <token>``, naming where it breaks but not
    what it holds: the error goes to logs and terminals, and the token is a secret."""
    if TOKEN_CHARS.fullmatch(token):
        return
    index = next((i for i, c in enumerate(token) if not _token_char(c)), None)
    if index is None:  # only '=' out of place
        index = token.index("=")
        problem = "'=' is only allowed as padding at the end"
    else:
        char = token[index]
        if char == " ":
            shown = "a space"
        elif char.isascii() and char.isprintable():
            shown = repr(char)
        else:
            shown = f"U+{ord(char):04X}"
        problem = f"{shown} is not allowed"
    raise ConfigError(
        f"{TOKEN_ENV}: character {index + 1} of the token: {problem}; a bearer token holds only "
        "ASCII letters, digits and - . _ ~ + / (then = padding), e.g. `openssl rand -hex 32`"
    )


def _token_char(char: str) -> bool:
    return char.isascii() and (char.isalnum() or char in "-._~+/=")
