"""Traffic at the proxy edge during the chaos soak: holders using their proxies, and what a
hostile client tries there beside them.

- **Holders use their leases.** Every crawler sends requests through its leased proxy while it
  holds the lease, with the credentials of the lease's ``proxy.url``, so a forged credential
  always has a holder's traffic to land beside (docs/decisions/0133-*.md: Squid's credential cache
  once let a forged password ride on the holder's check).
- **Forged credentials.** The hostile client knows a crawler's lease id (a ``read`` client sees
  it) and the proxy it is on, and sends bursts of concurrent requests with that id, or that id
  dressed as a credential, and passwords it made up.
- **Requests that leave the crawl.** Through a lease of its own, it asks the proxy for the
  cloud metadata name, the host's own ports by CONNECT, and the "this host" address ``0.0.0.0``
  (docs/providers.md, "Where a proxy may go"). Each must be refused at the proxy. Every target
  here is this machine or a name that does not resolve: nothing leaves the machine even if a
  rule were wrong.

Every answer is recorded; a 200 to any hostile attempt is evidence against the system.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

TIMEOUT = 2.0
FORGE_BURST = 8
"""Concurrent forged requests per attempt: enough to land beside a holder's pending check."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A proxy as a lease's ``proxy.url`` names it: where, and the Basic credential it carries."""

    host: str
    port: int
    credential: bytes

    @classmethod
    def of(cls, url: str) -> Endpoint | None:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return None
        if not parts.hostname or port is None:
            return None
        login = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        return cls(parts.hostname, port, login.encode())


async def exchange(host: str, port: int, request: bytes) -> str:
    """The status code of the answer to ``request`` (sent whole on a fresh connection), or why
    there is none."""
    try:
        async with asyncio.timeout(TIMEOUT):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(request)
                await writer.drain()
                status = (await reader.readline()).split(b" ")[1:2]
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError):
        return "unreachable"  # a Squid the soak killed
    return status[0].decode("latin-1") if status else "no answer"


def _authorization(credential: bytes) -> bytes:
    return b"Proxy-Authorization: Basic " + base64.b64encode(credential) + b"\r\n"


def get(target: str, credential: bytes, extra: bytes = b"") -> bytes:
    """A proxy request for ``http://<target>/``."""
    host = target.encode()
    return (
        (
            b"GET http://"
            + host
            + b"/ HTTP/1.1\r\nHost: "
            + host
            + b"\r\n"
            + _authorization(credential)
        )
        + extra
        + b"Connection: close\r\n\r\n"
    )


async def use(endpoint: Endpoint, origin_port: int) -> str:
    """One request of a holder through its proxy to the soak's origin."""
    request = get(f"127.0.0.1:{origin_port}", endpoint.credential)
    return await exchange(endpoint.host, endpoint.port, request)


def forged_credentials(lease_id: str) -> list[bytes]:
    """What someone who knows only the lease id can send: the id with any password, and the id
    followed by made-up credential parts."""
    made_up = secrets.token_hex(16)
    return [
        f"{lease_id}:x".encode(),
        f"{lease_id}:1.9999999999999.{made_up}".encode(),
        f"{lease_id}.{made_up}:{secrets.token_hex(4)}".encode(),
        f"{lease_id}.1.9999999999999.{made_up}:x".encode(),
    ]


async def forge(endpoint: Endpoint, lease_id: str, origin_port: int) -> list[tuple[bytes, str]]:
    """A burst of concurrent forged requests on a held proxy: each credential and its answer."""
    credentials = forged_credentials(lease_id)
    chosen = [credentials[i % len(credentials)] for i in range(FORGE_BURST)]
    answers = await asyncio.gather(
        *(
            exchange(endpoint.host, endpoint.port, get(f"127.0.0.1:{origin_port}", c))
            for c in chosen
        )
    )
    return list(zip(chosen, answers, strict=True))


def escapes(api_port: int) -> dict[str, bytes]:
    """Requests that leave the crawl, by name; ``{credential}`` is filled in per lease. Each
    names this machine or a name that cannot resolve here."""
    return {
        "metadata name": b"GET http://metadata.google.internal/computeMetadata/v1/ HTTP/1.1\r\n"
        b"Host: metadata.google.internal\r\nMetadata-Flavor: Google\r\n",
        "CONNECT to a host port": f"CONNECT 127.0.0.1:{api_port} HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{api_port}\r\n".encode(),
        "CONNECT to a mapped loopback": f"CONNECT [::ffff:127.0.0.1]:{api_port} HTTP/1.1\r\n"
        f"Host: [::ffff:127.0.0.1]:{api_port}\r\n".encode(),
        "this host (0.0.0.0)": f"GET http://0.0.0.0:{api_port}/healthz HTTP/1.1\r\n"
        f"Host: 0.0.0.0:{api_port}\r\n".encode(),
    }


async def escape(endpoint: Endpoint, name: str, api_port: int) -> str:
    head = escapes(api_port)[name]
    request = head + _authorization(endpoint.credential) + b"Connection: close\r\n\r\n"
    return await exchange(endpoint.host, endpoint.port, request)
