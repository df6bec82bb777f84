"""One question to a proxy service's gateway: does it let this login through? For the upstream
provider's preflight (docs/decisions/0160-upstream-proxy-services.md).

A ``CONNECT`` to ``probeTarget`` with a fresh session's login, answered by the gateway before
any byte reaches the target: 200 means the account, the grammar and the country are taken; a
refusal is read (status, ``Retry-After``, the start of its body) and mapped by
``pure.refusals``. The tunnel is closed without a byte sent through it, so a probe costs the
account no traffic worth counting.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib

from services.providers.upstream.pure.refusals import BODY_READ, Answer

MAX_HEAD = 16 * 1024
"""A gateway's answer head is a few hundred bytes; reading stops here."""


async def ask(
    host: str, port: int, username: str, password: str, target: str, *, timeout: float
) -> Answer:
    """The gateway's answer to ``CONNECT target`` with this login; status 0 when none came in
    ``timeout`` seconds (refused, reset, timed out)."""
    token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
    request = (
        f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {token}\r\n\r\n"
    ).encode()
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port, limit=MAX_HEAD)
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status, headers = _head(head)
            body = b""
            length = headers.get("content-length", "")
            if not 200 <= status < 300 and length.isdigit():
                body = await reader.read(min(int(length), BODY_READ))
    except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return Answer(0)
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    return Answer(
        status,
        retry_after=headers.get("retry-after", ""),
        body=body.decode("utf-8", "replace"),
    )


def _head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status and the headers (lower-case names) of an answer's head; status 0 for one
    that is no HTTP answer."""
    line, *rest = head.decode("latin-1").split("\r\n")
    parts = line.split(" ", 2)
    status = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
    headers = {}
    for item in rest:
        name, sep, value = item.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, headers
