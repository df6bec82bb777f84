"""The DigitalOcean API through its official async client, ``pydo.aio``: one request per call.

The client's pipeline is azure-core's. Its retry policy is built with no retries (the executor
owns retrying, with the delay the error class and the server's headers call for), and its HTTP
logging policy with none (it would log every request at INFO; the Authorization header is
redacted there, but the provider logs what matters itself). Every call asks for the raw status,
body and headers (``cls=``): pydo answers some errors (a 404 on get, a 400 on a firewall) as a
body instead of raising, and the taxonomy needs the status either way.

The token comes from the environment (read by ``from_config``) or from ``tokenFile``, read at
the first call and again after a 401, so a rotated Kubernetes Secret is picked up without a
restart. It is sent only over https, or over plain http to a loopback address (a test fake;
the config refuses any other http endpoint). It never appears in a message: answers are
scrubbed of it before they become errors.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from azure.core.exceptions import AzureError, HttpResponseError
from azure.core.pipeline.policies import AsyncRetryPolicy, SansIOHTTPPolicy
from pydo.aio import Client

from services.providers.base import Permanent, ProviderError, Transient
from services.providers.digitalocean.config import DigitalOceanConfig, endpoint
from services.providers.digitalocean.pure.classify import (
    AUTH_FIX,
    classify,
    is_throttled,
    retry_after,
)

log = structlog.get_logger("egress.provider.digitalocean")
REDACTED = "<redacted>"
MAX_MESSAGE = 500

Call = Callable[[Client, dict[str, Any]], Awaitable[Any]]


class Token:
    """The API token, kept out of every ``repr`` (providers end up in logged structures)."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Token({REDACTED})"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def _reply(pipeline_response: Any, deserialized: Any, headers: Any) -> Reply:
    """The ``cls`` hook of every pydo call: what came back, whatever pydo makes of it."""
    del headers  # pydo's parsed rate-limit headers; the raw ones say more
    response = pipeline_response.http_response
    body = deserialized if isinstance(deserialized, dict) else {}
    return Reply(int(response.status_code), body, dict(response.headers))


def _error_reply(exc: HttpResponseError) -> Reply:
    response = exc.response
    if response is None:
        return Reply(int(exc.status_code or 0), {"message": str(exc.message or exc)}, {})
    text = response.text() or ""
    try:
        body = json.loads(text)
    except ValueError:
        body = {"message": text.strip()[:MAX_MESSAGE]}
    headers = getattr(response, "headers", None) or {}
    status = int(exc.status_code or response.status_code or 0)
    return Reply(status, body if isinstance(body, dict) else {}, dict(headers))


class Api:
    """One provider entry's client: built at the first call, closed by ``close``."""

    def __init__(self, provider: str, config: DigitalOceanConfig, token: Token | None) -> None:
        self.provider = provider
        self.config = config
        self.endpoint = endpoint(config)
        self._env_token = token
        self._token: Token | None = None
        self._client: Client | None = None
        self._lock = asyncio.Lock()

    async def request(self, op: str, what: str, call: Call, *, absent_ok: bool = False) -> Reply:
        """Make one request. A 2xx answer is returned; so is a 404 when ``absent_ok`` (the
        caller decides what absence means); anything else raises its taxonomy class."""
        client = await self._client_for(what)
        options: dict[str, Any] = {
            "cls": _reply,
            "connection_timeout": self.config.timeout_seconds,
            "read_timeout": self.config.timeout_seconds,
        }
        if self.endpoint.startswith("http://"):
            options["enforce_https"] = False  # loopback only: config.py refuses any other
        try:
            async with asyncio.timeout(self.config.timeout_seconds):
                reply = await call(client, options)
        except HttpResponseError as exc:
            reply = _error_reply(exc)
            cause: Exception | None = self._scrubbed(exc)
        except (TimeoutError, AzureError, aiohttp.ClientError, OSError) as exc:
            raise Transient(self._scrub(f"{what}: {_failure(exc)}")) from exc
        except ValueError as exc:
            # A 2xx whose body is not JSON: not the API (a wrong endpointUrl, a proxy's page).
            raise Transient(f"{what}: the answer is not the API's JSON ({exc})") from exc
        else:
            cause = None
        if not isinstance(reply, Reply):
            raise Transient(f"{what}: the client answered {type(reply).__name__}, not a reply")
        if 200 <= reply.status < 300 or (absent_ok and reply.status == 404):
            return reply
        if reply.status == 401:
            await self._forget_client()  # re-read tokenFile: the Secret may have rotated
        error = self._error(op, what, reply)
        raise error from cause

    def _error(self, op: str, what: str, reply: Reply) -> ProviderError:
        error_id = str(reply.body.get("id") or "")
        message = str(reply.body.get("message") or "").strip()[:MAX_MESSAGE]
        cls = classify(reply.status, error_id, message, op=op)
        shown = f" {error_id}" if error_id else ""
        text = f"{what}: HTTP {reply.status}{shown}: {message or 'no message'}"
        if reply.status in (401, 403):
            text += f"; {AUTH_FIX}"
        slow = is_throttled(reply.status, error_id)
        delay = (
            retry_after(reply.headers, time.time(), throttled=slow) if cls is not Permanent else 0.0
        )
        return cls(self._scrub(text), retry_after=delay)

    def _scrub(self, text: str) -> str:
        for token in (self._token, self._env_token):
            if token is not None and token.value:
                text = text.replace(token.value, REDACTED)
        return text

    def _scrubbed(self, exc: HttpResponseError) -> HttpResponseError:
        """The client's error with the answer's text scrubbed too: it is chained, and a chained
        exception is printed with the traceback of whatever logs ours."""
        if self._scrub(str(exc)) != str(exc):
            exc.message = self._scrub(str(exc.message))
            exc.args = tuple(self._scrub(str(a)) for a in exc.args)
        return exc

    async def _client_for(self, what: str) -> Client:
        async with self._lock:
            if self._client is None:
                token = await self._read_token(what)
                self._token = token
                self._client = Client(
                    token.value,
                    endpoint=self.endpoint,
                    retry_policy=AsyncRetryPolicy(retry_total=0),
                    http_logging_policy=SansIOHTTPPolicy(),
                    user_agent="egress-proxies",
                )
            return self._client

    async def _read_token(self, what: str) -> Token:
        path = self.config.token_file
        if not path:
            if self._env_token is None or not self._env_token.value:
                raise Permanent(f"{what}: no API token; {AUTH_FIX}")
            return self._env_token
        try:
            text = await asyncio.to_thread(Path(path).read_text, encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not text"
            raise Permanent(
                f"{what}: tokenFile {path}: cannot read it ({reason}); mount the Secret "
                "holding the DigitalOcean token there, or fix the path"
            ) from exc
        value = text.strip()
        if not value or any(c.isspace() for c in value):
            raise Permanent(
                f"{what}: tokenFile {path} holds no token (empty, or more than one word); "
                "it must hold the DigitalOcean API token alone"
            )
        return Token(value)

    async def _forget_client(self) -> None:
        async with self._lock:
            client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def close(self) -> None:
        await self._forget_client()


def _failure(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    name = type(exc).__name__
    if "Timeout" in name:
        return f"timed out ({name})"
    return f"{name}: {exc}"
