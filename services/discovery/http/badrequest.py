"""The API's JSON error even for a request the HTTP parser refuses
(docs/decisions/0139-the-discovery-api-s-edges.md).

A header value holding a control byte (an ``Idempotency-Key`` with ``\\x01``, say) never reaches
the app: httptools and h11 refuse the request head, and uvicorn answers a plain-text 400
("Invalid HTTP request received."). A client that parses one error shape (docs/api.md,
"Errors") then fails on the body instead of reading the refusal. So the protocol class uvicorn
runs is wrapped: its 400 writer answers ``{"error": "invalid_request", "message": ...}``, with
``Connection: close`` as before, and the message names the header whose value holds the byte
when the chunk the parser failed on shows it.

Finding the header costs nothing on requests that parse: the protocol keeps a reference to the
last chunk it was given, and only a refusal looks at it.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import msgspec
import structlog

from services.discovery.http.errors import ErrorBody
from services.discovery.pure.errorcodes import STATUS, ErrorCode

log = structlog.get_logger("egress.discovery")

CODE = ErrorCode.INVALID_REQUEST
_HEADER = re.compile(rb"\r\n([!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}):([^\r\n]*)")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
"""A control byte in a header value (tab is allowed there)."""


def refusal_message(chunk: bytes) -> str:
    """Why the head was refused, naming the first header whose value holds a control byte in
    ``chunk`` (the data the parser failed on) when there is one."""
    for found in _HEADER.finditer(chunk):
        value = found[2]
        bad = _CONTROL.search(value)
        if bad is not None:
            name = found[1].decode("ascii")
            return (
                f"{name}: the header's value holds the control byte 0x{bad[0][0]:02x}; send "
                "printable ASCII"
            )
    return (
        "the request is not valid HTTP/1.1 (a header name or value with a byte HTTP does not "
        "allow, or a malformed request line); send printable ASCII in header values"
    )


def json_400(message: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """The whole answer, status line to body: the API's error shape, then the connection ends."""
    body = msgspec.json.encode(ErrorBody(error=CODE, message=message))
    lines = [f"HTTP/1.1 {STATUS[CODE]} Bad Request\r\n".encode()]
    lines += [name + b": " + value + b"\r\n" for name, value in default_headers]
    lines += [
        b"content-type: application/json\r\n",
        b"content-length: " + str(len(body)).encode() + b"\r\n",
        b"connection: close\r\n\r\n",
        body,
    ]
    return b"".join(lines)


class _JsonBadRequest:
    """Mixed in ahead of a uvicorn HTTP protocol (httptools or h11): both answer a head they
    cannot parse through ``send_400_response``."""

    transport: asyncio.Transport
    server_state: Any
    client: tuple[str, int] | None
    _last_chunk = b""

    def data_received(self, data: bytes) -> None:
        self._last_chunk = data  # a reference only: read only if the parser refuses it
        super().data_received(data)  # type: ignore[misc] # the protocol next in the MRO

    def send_400_response(self, msg: str) -> None:
        del msg  # uvicorn's plain text; ours says what was wrong
        message = refusal_message(self._last_chunk)
        log.info("request refused: not valid HTTP", client=str(self.client), message=message)
        self.transport.write(json_400(message, list(self.server_state.default_headers)))
        self.transport.close()


def json_bad_request(protocol: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """``protocol`` (a uvicorn HTTP protocol class) answering a head it refuses in JSON."""
    return type(f"Json{protocol.__name__}", (_JsonBadRequest, protocol), {})
