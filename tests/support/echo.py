"""An "echo URL" for tests: an HTTP server answering each caller its own address, as the public
what-is-my-IP services a health check fetches through a proxy do.

Locally every connection comes from a loopback address (a local Squid's ``outgoingAddress``), so
``mapping`` turns a source into the public address a test wants the proxy to appear from; an
unmapped source is answered as itself. ``behaviour`` makes the answer to one source go wrong the
ways a real echo service or a captive portal does: ``html`` (a 200 page that is not an address),
``hang`` (no answer at all, until the client or the server gives up) and ``error`` (a 500).
``requests`` counts the requests of each source (before mapping), whatever was answered.

Answers are ``ADDRESS\\n`` as ``text/plain`` (public echo services end the line too, so a reader
must strip it), or ``{"ip": "ADDRESS"}`` for ``?format=json``. Connections are kept alive as
HTTP/1.1 allows; a request head over ``MAX_HEAD`` bytes is answered 431 and the connection closed.

    async with echo_server() as echo:
        echo.mapping["127.0.0.2"] = "203.0.113.7"
        echo.behaviour["127.0.0.3"] = "hang"
        ... fetch echo.url through the proxies ...
        assert echo.requests["127.0.0.2"] == 1
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

HOST = "127.0.0.1"
MAX_HEAD = 16 * 1024
BEHAVIOURS = frozenset({"html", "hang", "error"})
HTML = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Wi-Fi</body></html>\n"


class Behaviours(dict[str, str]):
    """``behaviour``: a misspelt one would silently answer normally and a test pass for the
    wrong reason, so only ``BEHAVIOURS`` can be set."""

    def __setitem__(self, source: str, behaviour: str) -> None:
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"behaviour {behaviour!r}: use one of {sorted(BEHAVIOURS)}")
        super().__setitem__(source, behaviour)


@dataclass
class Echo:
    """The running server; change ``mapping`` and ``behaviour`` at any time, they are read on
    every request."""

    port: int = 0
    mapping: dict[str, str] = field(default_factory=dict)
    behaviour: dict[str, str] = field(default_factory=Behaviours)
    requests: Counter[str] = field(default_factory=Counter)
    _open: dict[asyncio.Task[None], asyncio.StreamWriter] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/ip"

    @property
    def json_url(self) -> str:
        return f"{self.url}?format=json"

    def answer_for(self, source: str) -> str:
        return self.mapping.get(source, source)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._open[task] = writer
        source = str(writer.get_extra_info("peername")[0])
        try:
            while await self._one_request(source, reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        finally:
            self._open.pop(task, None)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _one_request(
        self, source: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; whether the connection may carry another."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            writer.write(_response(431, "text/plain", b"request head too large\n", close=True))
            await writer.drain()
            return False
        lines = head.decode("latin-1").split("\r\n")
        _, target, version = [*lines[0].split(" "), "", "", ""][:3]
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        length = headers.get("content-length", "0")
        if length.isdigit() and int(length) <= MAX_HEAD and "transfer-encoding" not in headers:
            await reader.readexactly(int(length))
        else:
            writer.write(_response(400, "text/plain", b"unsupported body\n", close=True))
            await writer.drain()
            return False
        self.requests[source] += 1
        close = version != "HTTP/1.1" or headers.get("connection", "").lower() == "close"
        behaviour = self.behaviour.get(source, "")
        if behaviour == "hang":
            while await reader.read(65536):
                pass  # until the client closes, or the server stops and cancels us
            return False
        if behaviour == "html":
            writer.write(_response(200, "text/html; charset=utf-8", HTML, close=close))
        elif behaviour == "error":
            writer.write(_response(500, "text/plain", b"internal error\n", close=close))
        else:
            writer.write(self._address(source, target, close))
        await writer.drain()
        return not close

    def _address(self, source: str, target: str, close: bool) -> bytes:
        address = self.answer_for(source)
        query = parse_qs(urlsplit(target).query)
        if query.get("format") == ["json"]:
            body = json.dumps({"ip": address}).encode()
            return _response(200, "application/json", body, close=close)
        return _response(200, "text/plain", f"{address}\n".encode(), close=close)

    async def stop(self) -> None:
        """Hanging answers and idle kept-alive connections end with the server: their
        connections are closed, so each handler reads the end and returns (a cancelled handler
        would be logged as an error by asyncio's stream protocol on Python 3.11)."""
        for writer in self._open.values():
            writer.close()
        await asyncio.gather(*self._open, return_exceptions=True)


_REASONS = {200: "OK", 400: "Bad Request", 431: "Request Header Fields Too Large", 500: "Error"}


def _response(status: int, content_type: str, body: bytes, *, close: bool) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
    ]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@contextlib.asynccontextmanager
async def echo_server() -> AsyncIterator[Echo]:
    """An echo server on 127.0.0.1 and a free port, in the running event loop."""
    echo = Echo()
    server = await asyncio.start_server(echo.serve, HOST, 0, limit=MAX_HEAD)
    echo.port = int(server.sockets[0].getsockname()[1])
    try:
        yield echo
    finally:
        server.close()
        await echo.stop()
        await server.wait_closed()
