"""The console's sessions: one per client, signed, with an expiry and a revocation time.

A browser cannot send ``Authorization: Bearer`` on a page load, and a token in a URL ends up in
histories, logs and ``Referer`` headers. So the login form posts the client's token once, and
the answer sets an ``HttpOnly``, ``SameSite=Strict`` cookie (``Secure`` over https) holding
``v2.<client>.<issued ms>.<expires ms>.<mac>``, never the token
(docs/decisions/0096-a-lease-belongs-to-a-client-a.md):

- the mac is keyed with a random key every replica shares through the discovery KV bucket
  (``console.key``, created by the first replica), and covers the client's token hash: a
  session works on every replica and after restarts, and ends when the client's token changes
  or the client leaves the clients file;
- logging out stores the time in ``console.logout.<client>``: every session of that client
  issued before it ends, on this replica at once and on the others within a second (each polls
  the clients it has seen sessions of);
- a client removed from the clients file, given another token or no longer the ``read`` scope
  is logged out the same way by every replica that reads that file: a session is of one entry
  of the client, so re-adding the client with its old token does not bring its sessions back
  (docs/decisions/0135-counters-that-hold.md);
- failed logins are limited per client address and over all addresses (``LoginThrottle``), and
  logged up to those limits; a correct token logs in whatever the limits (``login``).

A request with a bearer token of a client with the ``read`` scope is let in too (``curl``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import secrets
import time
from typing import Any

import nats.errors
import structlog
from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from events.errors import StoreUnavailable
from services.runtime.clients import Clients
from services.runtime.eventlog.snapshots import SnapshotStore
from services.runtime.nats.users import KV_BUCKETS
from services.runtime.pure.clients import READ, Client
from services.runtime.pure.throttle import LoginThrottle

log = structlog.get_logger("egress.discovery.console")

COOKIE = "egress_console"
PATH = "/ui"
MAX_AGE = 12 * 3600
"""A session lasts a working day; the login form is one field."""
KEY = "console.key"
LOGOUT = "console.logout."
REFRESH_SECONDS = 1.0
KEY_REFRESH_SECONDS = 3600.0
"""The bucket drops keys a week after their last write: the key is written again hourly."""
FAILURES_PER_ADDRESS = 5.0
"""Failed logins a minute one address may make before they are answered 429."""
FAILURES_IN_ALL = 60.0
"""Failed logins a minute over all addresses before they are answered 429 (and not logged)."""


class Sessions:
    def __init__(
        self, clients: Clients, js: JetStreamContext | None, throttle: LoginThrottle | None = None
    ) -> None:
        self.clients = clients
        self.js = js
        self.throttle = throttle or LoginThrottle(FAILURES_PER_ADDRESS)
        self.all_failures = LoginThrottle(FAILURES_IN_ALL, max_addresses=1)
        self._key: bytes | None = None if js is not None else secrets.token_bytes(32)
        self._kv: KeyValue | None = None
        self._revoked: dict[str, int] = {}
        self._seen: dict[str, float] = {}
        self._unstored: dict[str, int] = {}
        """Logouts of clients that left the file, for the bucket (``run``)."""
        clients.on_leave(self._left)

    @property
    def required(self) -> bool:
        return not self.clients.open

    # ------------------------------------------------------------------------- checking

    def allows(self, connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
        return not self.required or self.who(connection) is not None

    def who(self, connection: ASGIConnection[Any, Any, Any, Any]) -> Client | None:
        """The client behind the request's cookie or bearer token, if it may read."""
        cookie = connection.cookies.get(COOKIE, "")
        if cookie:
            client = self._from_cookie(cookie)
            if client is not None:
                return client
        scheme, _, given = connection.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and given.strip():
            client = self.clients.identify(given.strip())
            if client is not None and client.may(READ):
                return client
        return None

    def _from_cookie(self, value: str) -> Client | None:
        parts = value.split(".")
        if len(parts) != 5 or parts[0] != "v2" or self._key is None:
            return None
        _, name, issued, expires, mac = parts
        if not (issued.isascii() and issued.isdigit() and expires.isascii() and expires.isdigit()):
            return None
        client = self.clients.by_name(name)
        if client is None or not client.may(READ):
            return None
        if not hmac.compare_digest(mac.encode(), self._mac(client, issued, expires).encode()):
            return None
        now = _now_ms()
        if int(expires) <= now or int(issued) <= self._revoked.get(name, 0):
            return None
        self._seen[name] = time.monotonic()
        return client

    def _mac(self, client: Client, issued: str, expires: str) -> str:
        assert self._key is not None
        message = f"{client.name}|{issued}|{expires}|{client.token_hash}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    # -------------------------------------------------------------------- login, logout

    def login(self, token: str) -> Client | None:
        client = self.clients.identify(token.strip()) if token.strip() else None
        return client if client is not None and client.may(READ) else None

    def failed_login(self, address: str, now: float) -> float:
        """Count a wrong token from ``address``; the seconds until another is answered 401
        rather than 429 (0: this one is). Failures over a limit are neither counted nor
        logged one by one: the first over it says so."""
        wait = max(self.throttle.retry_after(address, now), self.all_failures.retry_after("", now))
        if wait > 0:
            return wait
        self.throttle.failed(address, now)
        self.all_failures.failed("", now)
        log.warning("console login failed", client_address=address)
        if self.throttle.retry_after(address, now) > 0:
            log.warning(
                "console logins: further failures from this address are refused (429) and not "
                "logged for a while",
                client_address=address,
            )
        elif self.all_failures.retry_after("", now) > 0:
            log.warning(
                "console logins: too many failures from all addresses; further ones are refused "
                "(429) and not logged for a while"
            )
        return 0.0

    @property
    def ready(self) -> bool:
        """Whether sessions can be signed: the shared key has been read."""
        return self._key is not None

    def cookie(self, client: Client, *, secure: bool) -> Cookie:
        issued = _now_ms()
        # After this client's last logout as this replica knows it, whatever the clocks say.
        issued = max(issued, self._revoked.get(client.name, 0) + 1)
        expires = issued + MAX_AGE * 1000
        mac = self._mac(client, str(issued), str(expires))
        self._seen[client.name] = time.monotonic()
        return Cookie(
            key=COOKIE,
            value=f"v2.{client.name}.{issued}.{expires}.{mac}",
            path=PATH,
            max_age=MAX_AGE,
            httponly=True,
            samesite="strict",
            secure=secure,
        )

    async def logout(self, client: Client) -> None:
        """End every session of ``client``, here at once and on every replica within a second."""
        at = _now_ms()
        self._revoked[client.name] = max(at, self._revoked.get(client.name, 0))
        if self._kv is not None:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await self._kv.put(LOGOUT + client.name, str(at).encode())

    def _left(self, names: list[str]) -> None:
        """Clients that left the file (or changed their token or lost ``read``): their sessions
        end here now, and everywhere once ``run`` has stored it."""
        at = _now_ms()
        for name in names:
            self._revoked[name] = max(at, self._revoked.get(name, 0))
            self._unstored[name] = self._revoked[name]
            self._seen[name] = time.monotonic()
        log.info("console sessions ended: the clients file no longer lets them in", clients=names)

    async def _store_left(self) -> None:
        """Store the logouts ``_left`` made, never over a later one another replica stored."""
        kv = await self._open()
        for name, at in list(self._unstored.items()):
            try:
                stored = _logout_ms((await kv.get(LOGOUT + name)).value)
            except KeyNotFoundError:
                stored = 0
            if stored < at:
                await kv.put(LOGOUT + name, str(at).encode())
            if self._unstored.get(name) == at:
                del self._unstored[name]

    @staticmethod
    def cleared() -> Cookie:
        return Cookie(key=COOKIE, value="", path=PATH, max_age=0, httponly=True, samesite="strict")

    # ----------------------------------------------------------------------- the bucket

    async def run(self) -> None:
        """Read the shared key, then keep the logouts of the clients seen here current."""
        if self.js is None:
            return
        last_key_write = 0.0
        while True:
            try:
                if self._key is None or time.monotonic() - last_key_write > KEY_REFRESH_SECONDS:
                    await self._load_key()
                    last_key_write = time.monotonic()
                await self._store_left()
                await self.refresh()
            except (StoreUnavailable, nats.errors.Error, TimeoutError) as exc:
                log.warning("console sessions: the KV bucket cannot be read", error=str(exc))
            await asyncio.sleep(REFRESH_SECONDS)

    async def _open(self) -> KeyValue:
        if self._kv is None:
            assert self.js is not None
            bucket = KV_BUCKETS["discovery"]
            self._kv = await SnapshotStore(self.js, bucket, "console", 1, bytes).open()
        return self._kv

    async def _load_key(self) -> None:
        kv = await self._open()
        with contextlib.suppress(KeyWrongLastSequenceError):  # another replica made it first
            await kv.create(KEY, secrets.token_bytes(32))
        entry = await kv.get(KEY)
        if entry.value is None or len(entry.value) != 32:
            raise StoreUnavailable(f"{KEY} in the KV bucket is not a 32-byte key")
        self._key = entry.value
        await kv.put(KEY, entry.value)  # keeps it from expiring

    async def refresh(self) -> None:
        """The logout times of the clients with sessions seen here in the last ``MAX_AGE``."""
        kv = await self._open()
        horizon = time.monotonic() - MAX_AGE
        for name in [n for n, at in self._seen.items() if at < horizon]:
            del self._seen[name]
        for name in list(self._seen):
            try:
                entry = await kv.get(LOGOUT + name)
            except KeyNotFoundError:
                continue
            self._revoked[name] = max(_logout_ms(entry.value), self._revoked.get(name, 0))


def _logout_ms(value: bytes | None) -> int:
    text = (value or b"").decode("ascii", "replace")
    return int(text) if text.isascii() and text.isdigit() and len(text) < 20 else 0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
