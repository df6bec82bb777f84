"""What `up` does for its local proxies: a probe target on loopback, and a word at shutdown.

Offline, the health prober's default (an external connectivity check) fails through every proxy,
so a demo would have no healthy proxy to lease. When the operator names no check URL, `up` serves
a tiny target itself and points the prober at it for the proxies of its `local` providers; other
providers keep the external default, which is what their proxies are for. The same server is the
local proxies' echo URL (``echo_url``): ``GET /egress`` answers the address the connection came
from, which is the proxy's egress address (a local Squid's ``outgoingAddress``).

Local proxies outlive `up` on purpose (the next `up` adopts them), so `up` says at shutdown how
many keep running and how to stop them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from services.providers.config import ProviderEntry
from services.providers.local_process import PID_FILE, is_running, resolve_backend

PROBE_HOST = "127.0.0.1"
ECHO_PATH = "/egress"
MAX_HEAD = 16 * 1024
"""The most bytes of request head read (request line and headers); a longer one is answered 431
and the connection closed, so junk sent to the socket costs no more memory than this."""
READ_SECONDS = 5.0
_OK = b"ok\n"


@dataclass(frozen=True, slots=True)
class LocalProvider:
    name: str
    data_dir: Path
    backend: str


OUTLIVING_TYPES = ("local", "upstream")
"""Types whose proxies are processes on this host that outlive `up`: ``upstream`` runs the
local provider's Squids, chained to a proxy service
(docs/decisions/0160-upstream-proxy-services.md). Only ``local`` proxies are probed against
`up`'s own target: an upstream proxy's traffic leaves through its service, which cannot reach
this host's loopback."""


def local_providers(
    entries: list[ProviderEntry], *, types: tuple[str, ...] = ("local",)
) -> list[LocalProvider]:
    found = []
    for entry in entries:
        if entry.type not in types:
            continue
        config = entry.config
        try:
            backend = resolve_backend(str(getattr(config, "backend", "auto")))
        except ValueError as exc:
            backend = f"none ({exc})"
        found.append(LocalProvider(entry.name, Path(str(getattr(config, "data_dir", ""))), backend))
    return found


def probe_socket() -> socket.socket:
    """Bound before the services are built, so the URL they are given is already served."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((PROBE_HOST, 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def probe_url(sock: socket.socket) -> str:
    return f"http://{PROBE_HOST}:{sock.getsockname()[1]}/"


def echo_url(sock: socket.socket) -> str:
    """Where a local proxy's health check learns its egress address (``serve_probe_target``)."""
    return f"http://{PROBE_HOST}:{sock.getsockname()[1]}{ECHO_PATH}"


def _response(status: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _is_echo(request_line: bytes) -> bool:
    """``GET /egress`` with any query, in origin form or (from a proxy) absolute form."""
    method, _, rest = request_line.decode("latin-1").partition(" ")
    target = rest.partition(" ")[0]
    return method == "GET" and urlsplit(target).path == ECHO_PATH


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The request line once the whole head arrived, or None when it outgrew ``MAX_HEAD``."""
    request_line = b""
    size = 0
    while True:
        try:
            line = await reader.readline()
        except ValueError:  # one line longer than the reader's limit (MAX_HEAD)
            return None
        size += len(line)
        if size > MAX_HEAD:
            return None
        if not request_line:
            request_line = line.rstrip(b"\r\n")
        if line in (b"\r\n", b"\n", b""):
            return request_line


async def serve_probe_target(sock: socket.socket) -> None:
    """Until cancelled: ``GET /egress`` is answered the caller's address as plain text (the
    peer of the connection: through a local proxy, its outgoing address), every other request
    200 ``ok``. A request head is read for at most ``READ_SECONDS`` and ``MAX_HEAD`` bytes."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_SECONDS):
                request_line = await _read_head(reader)
            if request_line is None:
                writer.write(_response("431 Request Header Fields Too Large", b"too large\n"))
            elif _is_echo(request_line):
                peer = writer.get_extra_info("peername")
                writer.write(_response("200 OK", f"{peer[0]}\n".encode()))
            else:
                writer.write(_response("200 OK", _OK))
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(answer, sock=sock, limit=MAX_HEAD)
    async with server:
        await server.serve_forever()


def running_instances(providers: list[LocalProvider]) -> int:
    """Local proxies whose process is alive, under these providers' data dirs."""
    count = 0
    for provider in providers:
        instances = provider.data_dir / "instances"
        for path in sorted(instances.iterdir()) if instances.is_dir() else []:
            pid_file = path / PID_FILE
            text = pid_file.read_text().strip() if pid_file.is_file() else ""
            if text.isdigit() and is_running(int(text), path):
                count += 1
    return count


def still_running_note(count: int) -> str:
    if count == 0:
        return "no local proxies keep running"
    noun = "local proxy keeps" if count == 1 else "local proxies keep"
    return (
        f"{count} {noun} running; the next `up` adopts them; "
        "`egress-proxies delete --all` (while `up` runs) or `egress-proxies local stop` "
        "(with the same --data-dir, once it has stopped) stops them"
    )
