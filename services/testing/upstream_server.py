"""The fake proxy service's process: a residential or ISP proxy service's gateway on loopback,
for the tests of the ``upstream`` provider type (docs/providers.md, "The proxy service fake").

``python -m services.testing.upstream_server --grammar oxylabs --account acme
--country de=127.0.2.1-127.0.2.50 --country fr=127.0.3.1-127.0.3.50 --session-seconds 1800``
listens on two loopback ports and prints them, once listening, as one JSON line on stdout:
``{"proxy": N, "control": M}`` (``upstream.UpstreamService`` starts it and reads that line).
The account's password comes from the environment variable ``--password-env`` names (or a file,
``--password-file``), never from the command line: a test that looks for the password in every
``ps`` line must not find it there.

The proxy port speaks HTTP/1.1 as a forward proxy: absolute-form requests (GET, POST, any
method; a body with a Content-Length, a chunked one is answered 411) and CONNECT tunnels, with
``Proxy-Authorization: Basic``. The head is read by the gateway's bounded reader (httptools;
``services.gateway.reading``): whatever arrives gets an answer or a closed connection, never a
crash. A login is read with the service's grammar (``upstream_logins``); one that does not
parse, names another account or zone, or has the wrong password is answered 407 with the
reason in the body. The request then leaves from its exit (``upstream_exits``): the connection
to the site is bound to that 127.x.y.z address, so the site sees the session's exit as a real
site sees a residential peer. A request is sent to the site in origin form on a connection of
its own, closed after the answer; the client's connection is kept alive when both sides allow.

The control port (loopback clients only) answers JSON: ``GET /health``, ``GET /sessions`` (every
session with its exit and its traffic), ``GET /attempts`` (the last requests: the parsed login
without the password, the answer, the exit), ``POST /sessions/<id>/drop``,
``POST /sessions/<id>/move``, ``POST /faults`` (``{"status": 407|402|429, "times": N or null
for until cleared, "retryAfter": seconds, "session": id or null}``), ``POST /stalls``
(``{"times", "session"}``: accepted and never answered) and ``DELETE /faults`` (clears both).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from services.gateway.bounds import Refusal, close, drain
from services.gateway.pump import pump
from services.gateway.pure import heads
from services.gateway.pure.heads import HeadError, Target
from services.gateway.reading import CHUNK, Request
from services.testing.upstream_control import Control
from services.testing.upstream_exits import Book, Refused, parse_countries
from services.testing.upstream_heads import CHALLENGE, answer, expects_continue, origin_head
from services.testing.upstream_logins import GRAMMARS, Grammar, Login, LoginError, grammar
from services.testing.upstream_wire import (
    Traffic,
    UpstreamError,
    close_refused,
    read_head,
    read_request,
    stream_rest,
)

HEAD_TIMEOUT = 10.0
IDLE_TIMEOUT = 30.0
CONNECT_TIMEOUT = 5.0
MAX_CONNECTIONS = 512
MAX_ATTEMPTS = 1000
MAX_LOGIN = 1024
PASSWORD_ENV = "UPSTREAM_SERVICE_PASSWORD"


@dataclass
class Exchange:
    """One request as the service handles it: what it asked and where it goes."""

    request: Request | None
    user: str = ""
    login: Login | None = None
    target: Target | None = None
    country: str = ""
    exit: str = ""

    @property
    def session(self) -> str:
        return self.login.session if self.login else ""

    def attempt(self, status: int, reason: str) -> dict[str, Any]:
        """What the control API shows of it: never the password."""
        request = self.request
        return {
            "method": request.method if request else "",
            "target": request.url.decode("ascii", "replace")[:200] if request else "",
            "user": self.user[:200],
            "login": self.login.fields() if self.login else None,
            "status": status,
            "reason": reason,
            "exit": self.exit,
        }


FAULT_REASONS = {
    402: "the account's traffic is used up: add traffic to the plan",
    407: "the account is suspended",
    429: "too many requests for this account: slow down",
}


@dataclass
class Service:
    grammar: Grammar
    account: str
    password: str
    book: Book
    zone: str = ""
    own_ports: tuple[int, ...] = ()
    clock: Callable[[], float] = time.monotonic
    attempts: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_ATTEMPTS))
    stalled: int = 0
    _open: int = 0

    # ------------------------------------------------------------------ connections

    async def proxy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            with contextlib.suppress(OSError):
                writer.write(answer(503, "too many connections", [(b"Retry-After", b"1")]))
            writer.close()
            return
        self._open += 1
        try:
            first = True
            while True:
                try:
                    request = await read_request(reader, HEAD_TIMEOUT if first else IDLE_TIMEOUT)
                except HeadError as exc:
                    if exc.status == 408 and not first:
                        return
                    self._refuse(Exchange(None), exc.status, str(exc))
                if request is None or not await self._one(request, reader, writer):
                    return
                first = False
        except Refusal as refusal:
            await close_refused(reader, writer, refusal.answer)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, HeadError, UpstreamError):
            pass  # the client or the site went away, stalled or spoke nonsense mid-answer
        finally:
            self._open -= 1
            close(writer, IDLE_TIMEOUT)

    async def _one(
        self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; whether the connection may carry another."""
        exchange = Exchange(request)
        try:
            exchange.target = heads.target(request.method, request.url)
        except HeadError as exc:
            self._refuse(exchange, exc.status, str(exc))
        self._login(exchange)
        if heads.denied(exchange.target, self.own_ports) is not None:
            self._refuse(exchange, 403, "the service does not go to its own ports")
        if self.book.stall_for(exchange.session):
            self.attempts.append(exchange.attempt(0, "stalled"))
            await self._stall(reader)
            return False
        fault = self.book.fault_for(exchange.session)
        if fault is not None:
            extra = []
            if fault.status == 429:
                wait = 1 if fault.retry_after is None else fault.retry_after
                extra = [(b"Retry-After", str(wait).encode())]
            self._refuse(exchange, fault.status, FAULT_REASONS[fault.status], extra)
        assert exchange.login is not None
        exchange.country = self.book.country(exchange.login.country)
        try:
            exchange.exit = self.book.exit_for(
                exchange.session, exchange.country, self.clock(), asked=exchange.login.seconds
            )
        except Refused as refused:
            self._refuse(exchange, refused.status, refused.reason)
        self.book.count_request(exchange.session, exchange.country)
        if request.method == "CONNECT":
            await self._tunnel(exchange, reader, writer)
            return False
        if request.chunked:
            self._refuse(exchange, 411, "send the body with a Content-Length")
        return await self._forward(exchange, reader, writer)

    def _login(self, exchange: Exchange) -> None:
        assert exchange.request is not None
        found = heads.login(exchange.request.headers)
        if found is None:
            self._refuse(exchange, 407, "no Proxy-Authorization: Basic login", [CHALLENGE])
        exchange.user, password = found
        if len(exchange.user) + len(password) > MAX_LOGIN:
            self._refuse(exchange, 407, f"the login is longer than {MAX_LOGIN} characters")
        try:
            login = self.grammar.parse(exchange.user, password)
        except LoginError as exc:
            self._refuse(exchange, 407, f"the login does not parse: {exc}", [CHALLENGE])
        if login.account != self.account:
            self._refuse(exchange, 407, f"no account {login.account!r}", [CHALLENGE])
        if login.password != self.password:
            why = f"wrong password for the account {login.account!r}"
            self._refuse(exchange, 407, why, [CHALLENGE])
        if self.zone and login.zone != self.zone:
            self._refuse(exchange, 407, f"the account has no zone {login.zone!r}", [CHALLENGE])
        exchange.login = login

    def _refuse(
        self,
        exchange: Exchange,
        status: int,
        reason: str,
        extra: Sequence[tuple[bytes, bytes]] = (),
    ) -> NoReturn:
        self.attempts.append(exchange.attempt(status, reason))
        raise Refusal(answer(status, reason, extra))

    async def _stall(self, reader: asyncio.StreamReader) -> None:
        """Hold the connection, reading and dropping what comes, until the client leaves."""
        self.stalled += 1
        try:
            while await reader.read(CHUNK):
                pass
        finally:
            self.stalled -= 1

    # ------------------------------------------------------------------ relaying

    async def _open_to(self, exchange: Exchange) -> tuple[Any, Any]:
        target = exchange.target
        assert target is not None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                return await asyncio.open_connection(
                    target.host,
                    target.port,
                    local_addr=(exchange.exit, 0),
                    family=socket.AF_INET,
                    limit=64 * 1024,
                )
        except (OSError, TimeoutError) as exc:
            reason = f"cannot reach {target.authority} from {exchange.exit}: {exc!r}"
            self._refuse(exchange, 502, reason)

    async def _tunnel(
        self, exchange: Exchange, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        up_reader, up_writer = await self._open_to(exchange)
        self.attempts.append(exchange.attempt(200, ""))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        up = down = 0
        try:
            await drain(writer, IDLE_TIMEOUT)
            up, down = await pump((reader, writer), (up_reader, up_writer), IDLE_TIMEOUT)
        finally:
            close(up_writer, IDLE_TIMEOUT)
            self.book.count(exchange.session, exchange.country, up=up, down=down)

    async def _forward(
        self, exchange: Exchange, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        request, target = exchange.request, exchange.target
        assert request is not None
        assert target is not None
        up_reader, up_writer = await self._open_to(exchange)
        traffic = Traffic()
        try:
            head = origin_head(request, target)
            up_writer.write(head)
            traffic.up += len(head)
            left = request.length
            if left and expects_continue(request):
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the body, then the site's answer
            while left > 0:
                async with asyncio.timeout(IDLE_TIMEOUT):
                    data = await reader.read(min(left, CHUNK))
                if not data:
                    raise asyncio.IncompleteReadError(b"", left)
                up_writer.write(data)
                await drain(up_writer, IDLE_TIMEOUT)
                traffic.up += len(data)
                left -= len(data)
            await drain(up_writer, IDLE_TIMEOUT)
            try:
                response, seen = await read_head(
                    up_reader, IDLE_TIMEOUT, head_only=request.method == "HEAD"
                )
            except (UpstreamError, TimeoutError, HeadError) as exc:
                self._refuse(exchange, 502, f"the site did not answer: {exc}")
            self.attempts.append(exchange.attempt(response.status, ""))
            writer.write(seen)
            traffic.down += len(seen)
            await drain(writer, IDLE_TIMEOUT)
            whole = response.complete or await stream_rest(
                up_reader, writer, response, traffic, IDLE_TIMEOUT
            )
        finally:
            up_writer.close()
            self.book.count(exchange.session, exchange.country, up=traffic.up, down=traffic.down)
        return whole and request.keep_alive and response.keep_alive


# ----------------------------------------------------------------------------- the process


def _password(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    if args.password_file:
        try:
            text = Path(args.password_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            parser.error(f"--password-file: {exc.strerror or exc}")
    else:
        text = os.environ.get(args.password_env, "")
    if not text:
        parser.error(f"give the account's password in ${args.password_env} or --password-file")
    return text


async def serve(service: Service, host: str, port: int, control_port: int) -> None:
    control = Control(service)
    proxy_server = await asyncio.start_server(service.proxy, host, port, limit=64 * 1024)
    control_server = await asyncio.start_server(control.serve, "127.0.0.1", control_port)
    ports = {
        "proxy": proxy_server.sockets[0].getsockname()[1],
        "control": control_server.sockets[0].getsockname()[1],
    }
    service.own_ports = tuple(ports.values())
    print(json.dumps(ports), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with proxy_server, control_server:
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grammar", choices=GRAMMARS, required=True)
    parser.add_argument("--account", required=True)
    parser.add_argument("--zone", default="", help="brightdata: the zone logins must name")
    parser.add_argument("--password-env", default=PASSWORD_ENV)
    parser.add_argument("--password-file", default="")
    parser.add_argument(
        "--country",
        action="append",
        default=[],
        help="country=addresses, e.g. de=127.0.2.1-127.0.2.50 or fr=127.0.3.1,127.0.3.2",
    )
    parser.add_argument("--session-seconds", type=float, default=600.0)
    parser.add_argument("--user-template", default="", help="generic: the user name template")
    parser.add_argument("--password-template", default="", help="generic: default {password}")
    parser.add_argument("--regex", default="", help="generic: a regex for the user name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--control-port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        chosen = grammar(
            args.grammar,
            user_template=args.user_template,
            password_template=args.password_template,
            regex=args.regex,
        )
        countries = parse_countries(args.country)
    except ValueError as exc:
        parser.error(str(exc))
    if not 0 < args.session_seconds <= 7 * 86400:
        parser.error("--session-seconds: more than 0, at most 7 days")
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        parser.error("--host: a loopback address (the fake serves this machine only)")
    service = Service(
        chosen,
        args.account,
        _password(args, parser),
        Book(countries, args.session_seconds),
        zone=args.zone,
    )
    factory = None
    with contextlib.suppress(ImportError):
        import uvloop  # noqa: PLC0415 (the project's loop when installed, as its services run)

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(service, args.host, args.port, args.control_port))
    sys.exit(0)


if __name__ == "__main__":
    main()
