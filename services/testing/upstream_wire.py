"""The fake proxy service's reading and relaying, on asyncio streams: a request head read whole
and bounded, a refusal written and lingered on, an answer's head read and the rest streamed.

The fake reads with the gateway's parser (``services.gateway.reading``: one judgement of what
a head may be) but keeps its own stream loops: the gateway relays on protocols for its CPU's
sake, which a test's fake does not need, and a fake that leaned on the gateway's loops broke
each time they changed.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, cast

from services.gateway.pure.heads import HeadError
from services.gateway.reading import CHUNK, MAX_HEAD, Request, Response, parse_request, take_head

LINGER = 2.0
LINGER_BYTES = 1024 * 1024


class UpstreamError(Exception):
    """The site could not be reached, or answered nothing usable."""


@dataclass
class Traffic:
    up: int = 0
    down: int = 0


async def read_request(reader: asyncio.StreamReader, timeout: float) -> Request | None:
    """The next request's head; ``None`` when the client closed between requests."""
    buffer = bytearray()
    try:
        async with asyncio.timeout(timeout):
            while (raw := take_head(buffer)) is None:
                data = await reader.read(CHUNK)
                if not data:
                    raw = take_head(buffer, eof=True)
                    break
                buffer += data
    except TimeoutError:
        raise HeadError(f"no whole request head within {timeout:g} s", 408) from None
    if not raw:
        return None
    if buffer:
        _push_back(reader, bytes(buffer))
    return parse_request(raw)


def _push_back(reader: asyncio.StreamReader, data: bytes) -> None:
    """What came after the head (a body) goes back in front of the stream's buffer."""
    state = cast(Any, reader)  # the buffer is the stream's own; no public call puts bytes back
    state._buffer[:0] = data


async def close_refused(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: bytes
) -> None:
    """Write ``answer``, end our side, and read what the client still sends for at most
    ``LINGER`` seconds: a reset could overtake the answer."""
    with contextlib.suppress(OSError, TimeoutError, RuntimeError, asyncio.IncompleteReadError):
        async with asyncio.timeout(LINGER):
            writer.write(answer)
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            left = LINGER_BYTES
            while left > 0 and (data := await reader.read(CHUNK)):
                left -= len(data)


async def read_head(
    reader: asyncio.StreamReader, timeout: float, *, head_only: bool
) -> tuple[Response, bytes]:
    response = Response(head_only)
    seen = bytearray()
    async with asyncio.timeout(timeout):
        while not response.headers_done:
            data = await reader.read(CHUNK)
            if not data:
                raise UpstreamError("the site closed the connection before answering")
            seen += data
            if len(seen) > MAX_HEAD * 4 and not response.headers_done:
                raise UpstreamError("the site's answer head is too long")
            response.feed(data)
    return response, bytes(seen)


async def stream_rest(
    reader: asyncio.StreamReader,
    client: asyncio.StreamWriter,
    response: Response,
    traffic: Traffic,
    idle_timeout: float,
) -> bool:
    """Pass the rest of the response on; whether it ended as its framing says."""
    while not response.complete:
        try:
            async with asyncio.timeout(idle_timeout):
                data = await reader.read(CHUNK)
                if not data:
                    return False
                response.feed(data)
                traffic.down += len(data)
                client.write(data)
                await client.drain()
        except TimeoutError:
            return False
    return True
