"""Request bodies are decoded strictly, before Litestar sees them.

Litestar converts a body with msgspec's lax mode, which turns ``"60"`` into 60 and ``"inf"`` into
infinity. A lease of infinite length once reached the log that way, and the log keeps what it is
given for ever. So each body route checks its raw body with a strict decoder of the same Struct
first (a ``before_request`` hook): a wrong type is a 400 naming the field, and what reaches the
handler is exactly what the Struct allows. The handler still declares ``data``, so the OpenAPI
document describes the body.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from litestar import Request

from services.discovery.http.errors import InvalidRequest

_PATH = re.compile(r"^(?P<text>.*?) - at `\$\.?(?P<path>[^`]*)`\Z")
_FIELD_FIRST = re.compile(r"^[a-z][A-Za-z]{0,40}: ")
"""A message a Struct's own check raised, which names its field already (``models._target``)."""

HINTS = {
    "ttlSeconds": "a number of seconds from 1 to 604800, which is 7 days; null for the default",
    "exclude": "a list of at most 1000 proxy uids, each a string of 1 to 253 characters",
    "proxyUid": "a proxy uid, a string of 1 to 253 characters; null for any proxy",
    "pool": "a pool as NAMESPACE/NAME (crawl/de), or NAME in the namespace default; null for "
    "any proxy",
}
"""Said after the error of a field, so the client learns the rule and not only the breach."""


def problem(exc: msgspec.ValidationError) -> str:
    """``ttlSeconds: Expected `float` >= 1.0 (...)`` from msgspec's ``... - at `$.ttlSeconds```."""
    text = str(exc)
    found = _PATH.match(text)
    if found is None or not found["path"]:
        return text if _FIELD_FIRST.match(text) else f"the body: {text}"
    path, detail = found["path"], found["text"]
    field = path.split(".", 1)[0].split("[", 1)[0]
    hint = HINTS.get(field)
    return f"{path}: {detail}" + (f" ({hint})" if hint else "")


def strict_body(model: type[msgspec.Struct]) -> Callable[[Request[Any, Any, Any]], Awaitable[None]]:
    """A ``before_request`` hook that refuses a body ``model`` does not strictly accept."""
    decoder = msgspec.json.Decoder(model)

    async def check(request: Request[Any, Any, Any]) -> None:
        body = await request.body()
        if not body.strip():
            raise InvalidRequest("the body is empty; send a JSON object ({} for the defaults)")
        try:
            decoder.decode(body)
        except msgspec.ValidationError as exc:
            raise InvalidRequest(problem(exc)) from None
        except msgspec.DecodeError as exc:
            raise InvalidRequest(f"the body is not JSON: {exc}") from None

    return check
