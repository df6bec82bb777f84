"""The clients file of a running service, and ``DISCOVERY_TOKEN``'s admin client
(docs/api.md, "Clients"; D96).

``Clients`` holds the table of ``services.runtime.pure.clients``: the clients file, re-read every
quarter second (so a revoked token is refused within a second on every replica that reads the
same file), plus the token's admin client. It lives below the services so that every service
that authenticates crawlers (the discovery API, the gateway) reads one file alike; each wraps it
in its own front door (the discovery API's guard: ``services.discovery.http.access``) and counts
a broken file in its own metric through ``file_error``
(docs/decisions/0154-the-clients-table-below-the-services.md).

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

from services.runtime.pure.clients import (
    OPEN,
    READ,
    Client,
    ClientsError,
    ClientTable,
    hash_token,
    parse_clients,
)
from services.runtime.settings.errors import ConfigError

POLL_SECONDS = 0.25


class Clients:
    """The clients this replica knows; ``open`` when neither a file nor a token is configured.

    ``log``: the service's logger, so a re-read is logged under the service that made it.
    ``file_error``: called once per re-read that failed (the service's error counter).
    """

    def __init__(
        self,
        path: Path | None = None,
        token: str | None = None,
        *,
        log: Any = None,
        file_error: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self.token = token
        self.log = log if log is not None else structlog.get_logger("egress.clients")
        self.file_error = file_error
        self._raw: bytes | None = None
        self.table = ClientTable()
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
            if self.file_error is not None:
                self.file_error()
            self.log.error(
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
        self.log.info(
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
