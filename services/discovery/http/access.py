"""Who is calling, and what of theirs they may touch (docs/api.md, "Clients"; D96).

``Clients`` holds the table of ``services.discovery.pure.clients``: the clients file (re-read every
quarter second, so a revoked token is refused within a second on every replica that reads the
same file) plus ``DISCOVERY_TOKEN``'s admin client. The ``/v1`` guard identifies the caller from
its bearer token, checks the scope the route asks for (``opt={"scope": ...}``) and leaves the
``Client`` on the connection for the handlers, which check that a lease is the caller's own.

A clients file that stops parsing while the service runs keeps the table it had, loudly: the
alternative, refusing every crawler of the fleet over a typo, is the larger outage. A removed
client is refused as soon as a file without it parses.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard
from prometheus_client import CollectorRegistry, Counter

from projections.lease import LeaseRecord
from services.discovery.http.errors import ApiError
from services.discovery.pure.clients import (
    OPEN,
    READ,
    Client,
    ClientsError,
    ClientTable,
    hash_token,
    parse_clients,
)
from services.discovery.pure.errorcodes import ErrorCode
from services.runtime.observability.metrics import metric_set
from services.runtime.settings.errors import ConfigError

log = structlog.get_logger("egress.discovery")

CLIENTS_ENV = "DISCOVERY_CLIENTS_FILE"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="egress-proxies"'}
STATE_KEY = "egress_client"
POLL_SECONDS = 0.25


class Forbidden(ApiError):
    """The caller is known, but this is not theirs to do."""

    code = ErrorCode.FORBIDDEN


class NotYourLease(ApiError):
    code = ErrorCode.NOT_YOUR_LEASE


class LeaseLimit(ApiError):
    code = ErrorCode.LEASE_LIMIT


class AccessMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.refusals = Counter(
            "egress_api_refusals_total",
            "Requests refused for who sent them, by reason (unauthorized, scope, not_your_lease, "
            "selector, lease_limit, login_throttled)",
            ["reason"],
            registry=registry,
        )
        self.file_errors = Counter(
            "egress_api_clients_file_errors_total",
            "Re-reads of the clients file that failed (the table in use stays as it was)",
            registry=registry,
        )


def access_metrics(registry: CollectorRegistry) -> AccessMetrics:
    return metric_set(registry, AccessMetrics)


class Clients:
    """The clients this replica knows; ``open`` when neither a file nor a token is configured."""

    def __init__(self, path: Path | None = None, token: str | None = None) -> None:
        self.path = path
        self.token = token
        self._raw: bytes | None = None
        self.table = ClientTable()
        self.metrics: AccessMetrics | None = None
        if path is not None:
            try:
                self._raw = self._read()
                self.table = parse_clients(self._raw, str(path))
            except (OSError, ClientsError) as exc:
                raise ConfigError(f"--clients-file: {_reason(exc)}") from None
        if token is not None:
            try:
                self.table = self.table.with_default(token)
            except ClientsError as exc:
                raise ConfigError(f"--clients-file / DISCOVERY_TOKEN: {exc}") from None
        self._named = _named(self.table)
        self._on_leave: list[Callable[[list[str]], None]] = []

    def on_leave(self, listener: Callable[[list[str]], None]) -> None:
        """Call ``listener`` with the names of the clients a re-read removed, gave another token,
        or took the ``read`` scope from: what they were let in as has ended."""
        self._on_leave.append(listener)

    @property
    def open(self) -> bool:
        return self.path is None and self.token is None

    def identify(self, token: str) -> Client | None:
        if self.open:
            return OPEN
        client = self.table.identify(token)
        # The dictionary found it by the token's hash; comparing the hashes once more in
        # constant time costs nothing and keeps the answer independent of dict internals.
        if client is not None and hmac.compare_digest(client.token_hash, hash_token(token)):
            return client
        return None

    def by_name(self, name: str) -> Client | None:
        return self._named.get(name)

    def _read(self) -> bytes:
        assert self.path is not None
        with self.path.open("rb") as file:
            return file.read((1 << 20) + 1)

    def poll(self) -> bool:
        """Re-read the file; whether the table changed. A file that no longer parses (or
        cannot be read) leaves the table as it was, with an error logged and counted."""
        if self.path is None:
            return False
        try:
            raw = self._read()
            if raw == self._raw:
                return False
            table = parse_clients(raw, str(self.path))
            if self.token is not None:
                table = table.with_default(self.token)
        except (OSError, ClientsError) as exc:
            if self.metrics is not None:
                self.metrics.file_errors.inc()
            log.error(
                "the clients file cannot be used; the clients read before stay in force",
                path=str(self.path),
                error=_reason(exc),
            )
            self._raw = None  # report again next time, and take the file once it is mended
            return False
        before, was = set(self.table.names), self._named
        self._raw, self.table, self._named = raw, table, _named(table)
        left = [name for name, client in was.items() if _left(client, self._named.get(name))]
        for listener in self._on_leave if left else ():
            listener(left)
        log.info(
            "clients file re-read",
            path=str(self.path),
            clients=len(table.names),
            added=sorted(set(table.names) - before),
            removed=sorted(before - set(table.names)),
        )
        return True

    async def run(self, interval: float = POLL_SECONDS) -> None:
        while True:
            await asyncio.sleep(interval)
            self.poll()

    def guard(self, metrics: AccessMetrics) -> Guard:
        self.metrics = metrics

        def identify(
            connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
        ) -> None:
            client = OPEN if self.open else self._bearer(connection, metrics)
            scope = handler.opt.get("scope")
            if scope is not None and not client.may(scope):
                metrics.refusals.labels("scope").inc()
                raise Forbidden(
                    f"client {client.name!r} may not do this: it needs the {scope!r} scope "
                    "(the clients file lists each client's scopes)"
                )
            connection.state[STATE_KEY] = client

        return identify

    def _bearer(
        self, connection: ASGIConnection[Any, Any, Any, Any], metrics: AccessMetrics
    ) -> Client:
        scheme, _sep, given = connection.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            metrics.refusals.labels("unauthorized").inc()
            raise NotAuthorizedException(
                "this API needs `Authorization: Bearer <token>`", headers=CHALLENGE
            )
        client = self.identify(given.strip())
        if client is None:
            metrics.refusals.labels("unauthorized").inc()
            raise NotAuthorizedException("the bearer token is not valid", headers=CHALLENGE)
        return client


def caller(connection: ASGIConnection[Any, Any, Any, Any]) -> Client:
    """The client the guard identified (``OPEN`` on a route without the guard)."""
    client = connection.state.get(STATE_KEY)
    return client if isinstance(client, Client) else OPEN


def check_owner(client: Client, record: LeaseRecord, metrics: AccessMetrics | None) -> None:
    """Refuse a lease that is not ``client``'s: 403, naming neither the owner nor the holder."""
    if client.owns(record.client):
        return
    if metrics is not None:
        metrics.refusals.labels("not_your_lease").inc()
    raise NotYourLease(
        f"lease {record.lease_id} was acquired by another client; a client may use only the "
        "leases it acquired (an admin client may use any)"
    )


def check_acquire(client: Client, selector: dict[str, str], metrics: AccessMetrics | None) -> None:
    """The client's allowed selectors; its ``maxLeases`` is held by ``quota`` while a lease
    is granted (D135)."""
    if not client.allows_selector(selector):
        if metrics is not None:
            metrics.refusals.labels("selector").inc()
        allowed = ", ".join(str(dict(s)) for s in client.selectors)
        raise Forbidden(
            f"selector: client {client.name!r} may lease only with one of these selectors "
            f"(or narrower): {allowed}"
        )


def _left(before: Client, now: Client | None) -> bool:
    return (
        now is None
        or now.token_hash != before.token_hash
        or (before.may(READ) and not now.may(READ))
    )


def _named(table: ClientTable) -> dict[str, Client]:
    return {client.name: client for client in table.by_hash.values()}


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)
