"""The fake proxy service's control API (``upstream_server``): JSON over HTTP on a loopback port
of its own, for the test to make the service misbehave and to read what it counted.

One request per connection, its head read by the gateway's bounded reader, its body at most
``MAX_BODY`` bytes with a Content-Length; a client that is not on loopback is refused. A request
the API cannot read is answered 4xx with ``{"error": reason}``, never a crash: the control port
takes hostile bytes as the proxy port does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from services.gateway.bounds import close
from services.gateway.pure.heads import HeadError
from services.testing.upstream_exits import FAULT_STATUSES, Fault, Refused
from services.testing.upstream_heads import PHRASES
from services.testing.upstream_wire import close_refused, read_request

if TYPE_CHECKING:
    from services.testing.upstream_server import Service

MAX_BODY = 64 * 1024
TIMEOUT = 10.0
MAX_TIMES = 1_000_000
MAX_RETRY_AFTER = 86_400
SESSION_PATH = re.compile(r"/sessions/([^/]+)/(drop|move)")
SESSION_ID = re.compile(r"[A-Za-z0-9]{1,64}")


class ControlError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def reply(status: int, document: object) -> bytes:
    body = json.dumps(document).encode()
    head = (
        f"HTTP/1.1 {status} {PHRASES.get(status, 'Error')}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


class Control:
    def __init__(self, service: Service) -> None:
        self.service = service

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            if not peer or not ipaddress.ip_address(peer[0]).is_loopback:
                raise ControlError(403, "the control API answers loopback clients only")
            try:
                request = await read_request(reader, TIMEOUT)
            except HeadError as exc:
                raise ControlError(exc.status, str(exc)) from None
            if request is None:
                return
            if request.chunked:
                raise ControlError(411, "send the body with a Content-Length")
            if request.length > MAX_BODY:
                raise ControlError(413, f"the body is longer than {MAX_BODY} bytes")
            async with asyncio.timeout(TIMEOUT):
                body = await reader.readexactly(request.length) if request.length else b""
            path = urlsplit(request.url.decode("ascii", "replace")).path
            status, document = self.route(request.method, path, body)
            writer.write(reply(status, document))
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(TIMEOUT):
                    await writer.drain()
        except ControlError as exc:
            await close_refused(reader, writer, reply(exc.status, {"error": exc.reason}))
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            close(writer, TIMEOUT)

    def route(self, method: str, path: str, body: bytes) -> tuple[int, object]:
        service = self.service
        book = service.book
        now = service.clock()
        if (method, path) == ("GET", "/health"):
            return 200, {
                "grammar": service.grammar.name,
                "countries": {c: list(e) for c, e in book.countries.items()},
                "sessionSeconds": book.lifetime,
                "stalled": service.stalled,
            }
        if (method, path) == ("GET", "/sessions"):
            return 200, {"sessions": book.report(now)}
        if (method, path) == ("GET", "/attempts"):
            return 200, {"attempts": list(service.attempts)}
        if (method, path) == ("POST", "/faults"):
            fields = _document(body)
            book.add_fault(_fault(fields, status=_status(fields)))
            return 201, {"faults": len(book.faults)}
        if (method, path) == ("POST", "/stalls"):
            book.add_stall(_fault(_document(body), status=0))
            return 201, {"stalls": len(book.stalls)}
        if (method, path) == ("DELETE", "/faults"):
            book.clear()
            return 200, {"faults": 0, "stalls": 0}
        found = SESSION_PATH.fullmatch(path)
        if found is not None and method == "POST":
            session = _session_id(unquote(found[1]))
            if found[2] == "drop":
                dropped = book.drop(session)
                if not dropped:
                    raise ControlError(404, f"no live session {session!r}")
                return 200, {"dropped": dropped}
            try:
                moved = book.move(session, now)
            except Refused as refused:
                raise ControlError(refused.status, refused.reason) from None
            if not moved:
                raise ControlError(404, f"no live session {session!r}")
            return 200, {"exits": moved}
        raise ControlError(404, f"no route {method} {path[:100]!r}")


def _document(body: bytes) -> dict[str, Any]:
    try:
        found = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ControlError(400, "the body is not JSON") from None
    if not isinstance(found, dict):
        raise ControlError(400, "the body is not a JSON object")
    unknown = set(found) - {"status", "times", "retryAfter", "session"}
    if unknown:
        raise ControlError(400, f"unknown fields {sorted(unknown)[:5]}")
    return found


def _integer(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ControlError(400, f"{name} is a whole number from {low} to {high}")
    return value


def _status(fields: dict[str, Any]) -> int:
    status = fields.get("status")
    if status not in FAULT_STATUSES or isinstance(status, bool):
        raise ControlError(400, f"status is one of {list(FAULT_STATUSES)}")
    return int(status)


def _session_id(value: object) -> str:
    if not isinstance(value, str) or not SESSION_ID.fullmatch(value):
        raise ControlError(400, "a session id is 1 to 64 letters and digits")
    return value


def _fault(fields: dict[str, Any], *, status: int) -> Fault:
    times = fields.get("times", 1)
    remaining = None if times is None else _integer(times, "times", 1, MAX_TIMES)
    retry = fields.get("retryAfter")
    retry_after = None if retry is None else _integer(retry, "retryAfter", 0, MAX_RETRY_AFTER)
    session = fields.get("session")
    return Fault(status, remaining, retry_after, None if session is None else _session_id(session))
