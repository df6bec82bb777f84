"""What `up` does for its local proxies: a probe target on loopback, and a word at shutdown.

Offline, the health prober's default (an external connectivity check) fails through every proxy,
so a demo would have no healthy proxy to lease. When the operator names no check URL, `up` serves
a tiny target itself and points the prober at it for the proxies of its `local` providers; other
providers keep the external default, which is what their proxies are for.

Local proxies outlive `up` on purpose (the next `up` adopts them), so `up` says at shutdown how
many keep running and how to stop them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass
from pathlib import Path

from services.providers.config import ProviderEntry
from services.providers.local_process import PID_FILE, is_running, resolve_backend

PROBE_HOST = "127.0.0.1"
_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n"
    b"Connection: close\r\n\r\nok\n"
)


@dataclass(frozen=True, slots=True)
class LocalProvider:
    name: str
    data_dir: Path
    backend: str


def local_providers(entries: list[ProviderEntry]) -> list[LocalProvider]:
    found = []
    for entry in entries:
        if entry.type != "local":
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


async def serve_probe_target(sock: socket.socket) -> None:
    """Answer every request with 200 until cancelled."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
            writer.write(_ANSWER)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(answer, sock=sock)
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
        "`egress-proxies delete --all` (while `up` runs) or `make clean` stops them"
    )
