"""Who a request is for, and what it asks (docs/gateway.md, "Logging in").

The proxy login is checked against the clients file on every request, and an address that keeps
guessing is throttled before its login is read. A crawler's keep-alive connection sends the same
``Proxy-Authorization`` (and ``X-Egress-Params``) with every request, so a login that passed is
remembered, by the exact header values, for as long as the clients table it passed against is
the one in force: a re-read of the file that changes anything forgets every remembered login,
and a removed client is refused at its next request as before.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from services.gateway.leases import Caller
from services.gateway.metrics import GatewayMetrics
from services.gateway.pure import heads
from services.gateway.pure.heads import Header
from services.gateway.pure.username import Ask, UserNameError, parse, parse_params
from services.runtime.clients import Clients
from services.runtime.pure.clients import LEASE, ClientTable
from services.runtime.pure.throttle import LoginThrottle

OPEN_CLIENT = "open"
REMEMBERED = 10_000
"""Logins remembered at once, the least recently used forgotten first."""


@dataclass
class Doorman:
    clients: Clients
    metrics: GatewayMetrics
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    _passed: OrderedDict[tuple[bytes | None, bytes | None], tuple[Caller, Ask]] = field(
        default_factory=OrderedDict
    )
    _table: ClientTable | None = None

    def who(
        self,
        headers: list[Header],
        address: str,
        raw: tuple[bytes | None, bytes | None] | None = None,
    ) -> tuple[Caller, Ask] | bytes:
        """The caller and what it asks, or the answer refusing it. ``raw``: the first
        ``Proxy-Authorization`` and ``X-Egress-Params`` values, when the parser noted them."""
        if raw is None:
            raw = (_one(headers, b"proxy-authorization"), _one(headers, heads.PARAMS_HEADER))
        if not self.clients.open:
            if raw[0] is None:
                return self._login_refusal(
                    "this gateway needs a proxy login: your client name "
                    "(with parameters) and your token",
                    "unauthorized",
                )
            wait = self.throttle.retry_after(address, time.monotonic())
            if wait > 0:
                self.metrics.refusals.labels("throttled").inc()
                return heads.answer(
                    429,
                    "too many failed logins from this address",
                    extra=[(b"Retry-After", str(int(wait) + 1).encode())],
                )
        if self._table is not self.clients.table:
            self._passed.clear()
            self._table = self.clients.table
        found = self._passed.get(raw)
        if found is not None:
            self._passed.move_to_end(raw)
            return found
        answer = self._check(headers, address)
        if not isinstance(answer, bytes):
            self._passed[raw] = answer
            while len(self._passed) > REMEMBERED:
                self._passed.popitem(last=False)
        return answer

    def known(
        self, raw: tuple[bytes | None, bytes | None], address: str
    ) -> tuple[Caller, Ask] | None:
        """The caller of a login that passed against the table in force, when ``who`` would
        give it without a check or a refusal to count; ``None``: ask ``who``."""
        if self._table is not self.clients.table:
            return None
        if not self.clients.open and (
            raw[0] is None or self.throttle.retry_after(address, time.monotonic()) > 0
        ):
            return None
        found = self._passed.get(raw)
        if found is not None:
            self._passed.move_to_end(raw)
        return found

    def _check(self, headers: list[Header], address: str) -> tuple[Caller, Ask] | bytes:
        given = heads.login(headers)
        extra = heads.params(headers)
        if self.clients.open:
            user = given[0] if given else OPEN_CLIENT
            try:
                label, ask = parse(user, None)
                ask = _with_header(ask, extra)
            except UserNameError as exc:
                return self._login_refusal(str(exc), "user_name")
            return Caller(label, None), ask
        if given is None:
            return self._login_refusal(
                "this gateway needs a proxy login: your client name (with parameters) and "
                "your token, as Basic",
                "unauthorized",
            )
        user, token = given
        client = self.clients.identify(token)
        if client is None:
            self.throttle.failed(address, time.monotonic())
            return self._login_refusal(
                "the token (the proxy password) is not valid", "unauthorized"
            )
        if not client.may(LEASE):
            self.metrics.refusals.labels("scope").inc()
            return heads.answer(
                403, f"client {client.name!r} may not lease (it lacks the lease scope)"
            )
        try:
            _, ask = parse(user, client.name)
            ask = _with_header(ask, extra)
        except UserNameError as exc:
            return self._login_refusal(str(exc), "user_name")
        return Caller(client.name, token), ask

    def _login_refusal(self, reason: str, kind: str) -> bytes:
        self.metrics.refusals.labels(kind).inc()
        return heads.answer(407, reason, extra=[heads.CHALLENGE])


def _with_header(ask: Ask, extra: str) -> Ask:
    """``X-Egress-Params`` stands for the user name's parameters when the login has none."""
    if not extra:
        return ask
    if ask != Ask():
        raise UserNameError("parameters in both the user name and X-Egress-Params; use one")
    return parse_params(extra)


def _one(headers: list[Header], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None
