"""The discovery API over HTTP for the CLI's ``lease`` commands, with the errors its answers mean.

Plain ``urllib``: one request per command does not need a client library, and a CLI that an
operator of egress proxies runs must not pick up ``HTTP_PROXY`` from the environment. Each error
code of the API (docs/api.md, "Errors") becomes an exception whose exit code a script acts on.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import click
from opentelemetry import propagate
from rich.console import Console

from services.cli.pure.render import clean, inert
from services.discovery.pure.errorcodes import ErrorCode
from services.runtime.bearer import TOKEN_ENV
from services.runtime.nats.connection import ConnectError
from services.runtime.settings.errors import ConfigError

DEFAULT_API_URL = "http://127.0.0.1:8080"
EXIT_NO_PROXY = 6
EXIT_UNKNOWN_LEASE = 7
EXIT_NO_MATCH = 8
EXIT_ROTATION_NOT_DONE = 11


class LeaseFailed(click.ClickException):
    """An answer a script acts on by its exit code; shown like every other CLI error."""

    def show(self, file: Any = None) -> None:
        Console(stderr=True, soft_wrap=True, highlight=False).print(
            inert(f"error: {self.message}", style="red")
        )


class NoProxyFree(LeaseFailed):
    exit_code = EXIT_NO_PROXY


class LeaseGone(LeaseFailed):
    exit_code = EXIT_UNKNOWN_LEASE


class NoMatch(LeaseFailed):
    exit_code = EXIT_NO_MATCH


class RotationNotDone(LeaseFailed):
    """``lease rotate --wait`` saw the rotation fail or be cancelled, or not end in time; the
    lease stays on its old instance (exit 11: not a bug, which 1 means)."""

    exit_code = EXIT_ROTATION_NOT_DONE


class Unavailable(ConnectError):
    """The API answered 503 ``unavailable`` (it cannot reach NATS): safe to retry, once."""

    def __init__(self, message: str, retry_after: str = "") -> None:
        super().__init__(message)
        self.retry_after = float(retry_after) if retry_after.isdigit() else 1.0


class Unexpected(LeaseFailed):
    """The API failed, or answered what no version of it sends (exit 1, as for any failure)."""


@dataclass(frozen=True, slots=True)
class DiscoveryClient:
    base: str
    token: str | None
    timeout: float = 10.0

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        idempotency_key: str = "",
    ) -> Any:
        """The decoded answer (None for 204); an error answer raises what its code means."""
        headers = {"Accept": "application/json"}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        propagate.inject(headers)  # the command's trace continues in the API (cli/tracing.py)
        request = urllib.request.Request(
            self.base + path, data=data, headers=headers, method=method
        )
        # No proxy from the environment: this API is reached directly, and an operator of
        # egress proxies may well have HTTP_PROXY set for something else.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            with exc:  # it holds the response's socket until closed
                refused = self._refused(exc)
            raise refused from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConnectError(
                f"cannot reach the discovery API at {self.base}: {reason}. Start it "
                "(`egress-proxies up`) or set --api-url / DISCOVERY_URL"
            ) from None
        except ValueError as exc:  # http.client's verdict on a URL or header it cannot send
            raise ConfigError(f"cannot send this request to {self.base}: {exc}") from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise Unexpected(f"the discovery API at {self.base} answered no JSON") from None

    def _refused(self, exc: urllib.error.HTTPError) -> Exception:
        try:
            answer = json.loads(exc.read() or b"{}")
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        # The answer is the server's text: one line, nothing a terminal would act on.
        code = str(answer.get("error", ""))
        message = clean(answer.get("message", "")) or f"HTTP {exc.code}"
        if code == ErrorCode.NO_PROXY_AVAILABLE:
            retry = clean(exc.headers.get("Retry-After") or "")
            hint = f"; try again in {retry} s" if retry else ""
            return NoProxyFree(f"no proxy available: {message}{hint}")
        if code in (ErrorCode.UNKNOWN_LEASE, ErrorCode.LEASE_ENDED):
            return LeaseGone(message)
        if code == ErrorCode.NO_MATCHING_PROXY:
            return NoMatch(f"no proxy matches: {message}")
        if code == ErrorCode.UNAVAILABLE:
            retry = clean(exc.headers.get("Retry-After") or "")
            return Unavailable(
                f"the discovery API at {self.base} cannot serve now: {message}", retry
            )
        if exc.code == 401:
            return ConfigError(
                f"the discovery API refused the request ({message}); set {TOKEN_ENV}"
            )
        if exc.code == 503:
            return ConnectError(f"the discovery API at {self.base} cannot serve yet: {message}")
        if exc.code < 500:
            return ConfigError(f"the discovery API refused the request: {message}")
        return Unexpected(f"the discovery API failed: {message} (HTTP {exc.code})")
