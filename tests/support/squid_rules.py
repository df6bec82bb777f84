"""Real Squids run from a provider's generated configuration, a listener that records every
connection it accepts, and a raw client that reports exactly what Squid answered.

Used by the tests of where a proxy lets its holder go (D134): a refusal must be Squid's own
(403 with ``X-Squid-Error: ERR_ACCESS_DENIED``) and nothing may reach the listener; an allowed
request reaches it with exactly the headers the client sent.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from services.runtime.ports import free_port

SQUID = shutil.which("squid") or "/usr/sbin/squid"


@dataclass
class Listener:
    """A TCP listener on ``host`` that answers every request 200 and records each connection
    (``accepted``) and each request head it read, raw (``heads``)."""

    host: str
    port: int = 0
    accepted: int = 0
    heads: list[bytes] = field(default_factory=list)


@contextmanager
def recording(host: str = "127.0.0.1") -> Iterator[Listener]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(64)
    listener = Listener(host, server.getsockname()[1])
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            listener.accepted += 1
            with conn:
                conn.settimeout(5)
                head = b""
                try:
                    while b"\r\n\r\n" not in head and (more := conn.recv(65536)):
                        head += more
                    listener.heads.append(head)
                    # It closes after each answer, so it says so: a proxy that kept the
                    # connection for the next request could send it there before it saw the
                    # close, and answer 502 (ERR_READ_ERROR) on a busy machine.
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                    )
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener
    finally:
        stop.set()
        # close() alone leaves the thread blocked in accept(); shutdown() wakes it at once.
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(5)


@dataclass(frozen=True)
class Answer:
    status: int
    squid_error: str


def ask(proxy_url: str, request_line: str, headers: Sequence[tuple[str, str]] = ()) -> Answer:
    """Send one request head to the proxy, as written (credentials in ``proxy_url`` become
    ``Proxy-Authorization``), and read Squid's answer."""
    parts = urlsplit(proxy_url)
    lines = [request_line, *(f"{name}: {value}" for name, value in headers)]
    if parts.username:
        raw = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        lines.append(f"Proxy-Authorization: Basic {base64.b64encode(raw).decode()}")
    data = ("\r\n".join(lines) + "\r\nConnection: close\r\n\r\n").encode("latin-1")
    with socket.create_connection((parts.hostname or "", parts.port or 0), timeout=15) as sock:
        sock.sendall(data)
        head = b""
        while b"\r\n\r\n" not in head and (more := sock.recv(65536)):
            head += more
    status = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    error = re.search(rb"\r\nX-Squid-Error: (\S+)", head)
    return Answer(int(status[1]) if status else 0, error[1].decode() if error else "")


@contextmanager
def squid_workdir() -> Iterator[Path]:
    """A directory Squid's unprivileged user can read and write: pytest's own are private to
    root (mode 0700), and Squid reads its hosts file and ACL files after dropping to it."""
    path = Path(tempfile.mkdtemp(prefix="egress-squid-"))
    os.chmod(path, 0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def squid_running(config: str, workdir: Path) -> Iterator[str]:
    """Squid from ``config`` (its ``http_port`` a loopback ``host:port``), in the foreground
    under a service name of its own, its files in ``workdir`` (a ``squid_workdir``); yields
    its URL."""
    match = re.search(r"^http_port (\S+):(\d+)$", config, re.MULTILINE)
    assert match, "the test's config listens on a loopback host:port"
    conf = workdir / "squid.conf"
    conf.write_text(config)
    service = f"egresstest{os.getpid()}x{match[2]}"
    with (workdir / "stderr.log").open("wb") as stderr:
        process = subprocess.Popen(
            [SQUID, "-N", "-n", service, "-f", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (workdir / "stderr.log").read_text()
            try:
                socket.create_connection((match[1], int(match[2])), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "Squid never listened"
                time.sleep(0.05)
        yield f"http://{match[1]}:{match[2]}"
    finally:
        process.terminate()
        process.wait(10)
        for segment in Path("/dev/shm").glob(f"{service}-*"):
            segment.unlink(missing_ok=True)


def loopback_listen() -> str:
    """A free loopback ``host:port`` for a Squid's ``http_port``."""
    return f"127.0.0.1:{free_port()}"
