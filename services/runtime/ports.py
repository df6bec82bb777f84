"""Free ports for the servers this project starts (the embedded nats-server, test and bench peers).

Why not ``bind(0)``: the kernel answers from the ephemeral range, where every outgoing connection
of the machine draws its local port, so a connection opened between the choice and the server's
bind can take it. A port below that range can only be lost to another server's bind, which the
caller retries (``EmbeddedNatsServer.start``).
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

from services.runtime.settings.errors import ConfigError

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS = (20000, 32767)
"""Where a free port for a server is looked for: below Linux's default ephemeral range, so no
outgoing connection can take it between the choice and the server's bind."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a server to bind a moment later. Chosen outside the ephemeral range
    when that range is known (``bind(0)`` answers from inside it, where every outgoing connection
    of the machine draws its local port); a bind can still lose a race, and ``start`` retries."""
    low, high = LISTEN_PORTS
    with contextlib.suppress(OSError, ValueError):
        first = int(EPHEMERAL.read_text().split()[0])
        high = min(high, first - 1)
    for _ in range(64):
        port = random.randint(low, high) if high > low else 0
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            chosen: int = sock.getsockname()[1]
            return chosen
    with socket.socket() as sock:
        sock.bind((host, 0))
        fallback: int = sock.getsockname()[1]
        return fallback


def listening_socket(host: str, port: int, flags: str) -> socket.socket:
    """A listening TCP socket for a service's port; ``flags`` name the options that chose it, for
    the error. Made with ``IPPROTO_TCP`` spelled out: asyncio switches Nagle off only on sockets
    whose protocol says TCP, and with Nagle on every small answer waits for the client's delayed
    ACK (about 40 ms)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"{flags}: cannot listen on {host}:{port} ({exc.strerror or exc}); choose a free port"
        ) from exc
    return sock
