"""A hostile client beside the soak's crawlers: what reaches the edges must change nothing.

It runs under its own client of the discovery API (``hostile``, scopes ``lease`` and ``read``)
while the crawlers run under theirs (``crawler``), and until the load stops it keeps doing what
an attacker who can reach the ports would (docs/operations.md, "Security model"):

- **malformed credentials at the proxy ports**: a non-ASCII mac, a token of ``²``, 8 KiB of junk,
  bytes that are not UTF-8, ``é:é``; each answer must be a refusal (407), never a 200;
- **another client's lease ids**: the crawlers' newest leases, read, renewed, reported on,
  rotated and released as ``hostile``; each must be refused (403 ``not_your_lease``, or 404
  once the lease is gone), never done;
- **abandoned time travels**: console pages as of a past instant, given up after a fraction of
  a second, which the replica must stop folding and bound.

The check is that nothing the hostile client asked for took effect; the soak's other checks
(no lease doubled or lost, every proxy serving at the end) must hold beside it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from bench.chaos_check import Check
from bench.chaos_load import Record, call
from services.discovery.pure.clients import hash_token

CRAWLER_TOKEN = secrets.token_hex(32)
HOSTILE_TOKEN = secrets.token_hex(32)
PAUSE = 0.05
"""Between two hostile actions: about 20 a second, beside the crawlers' load."""

BAD_CREDENTIALS: tuple[bytes, ...] = (
    b"lease-1:1.9999999999999.\xc3\xa9\xc3\xa9",
    "lease-1:\u00b2.9999999999999.abcd".encode(),
    b"x" * 8192,
    b"\xff\xfe\xfd:\x80\x81",
    "\u00e9:\u00e9".encode(),
    b"egress-probe:9999999999999.\x00\x01",
    b":",
)


def clients_file() -> str:
    """The soak's clients: the crawlers' and the hostile one's, each its own."""
    lines = ["clients:"]
    for name, token in (("crawler", CRAWLER_TOKEN), ("hostile", HOSTILE_TOKEN)):
        lines += [f"  - name: {name}", f"    token: {hash_token(token)}"]
        lines += ["    scopes: [lease, read]"]
    return "\n".join(lines) + "\n"


@dataclass
class Hostile:
    """What the hostile client was answered, by kind of attempt."""

    proxy_answers: Counter[str] = field(default_factory=Counter)
    lease_answers: Counter[str] = field(default_factory=Counter)
    travels: Counter[str] = field(default_factory=Counter)
    taken: list[str] = field(default_factory=list)
    """Attempts that were not refused: each one is evidence against the system."""


async def proxy_attempt(url: str, credential: bytes, origin_port: int) -> str:
    """One request through the proxy at ``url`` with ``credential`` as its Basic login."""
    parts = urlsplit(url)
    header = b"Proxy-Authorization: Basic " + base64.b64encode(credential) + b"\r\n"
    target = f"127.0.0.1:{origin_port}".encode()
    request = b"GET http://" + target + b"/ HTTP/1.1\r\nHost: " + target + b"\r\n" + header
    try:
        async with asyncio.timeout(2.0):
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
            try:
                writer.write(request + b"Connection: close\r\n\r\n")
                await writer.drain()
                status = (await reader.readline()).split(b" ")[1:2]
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError):
        return "unreachable"  # a Squid the soak killed
    return status[0].decode("latin-1") if status else "no answer"


async def lease_attempt(port: int, lease_id: str, rng: random.Random) -> str:
    method, path, body = rng.choice(
        [
            ("GET", f"/v1/leases/{lease_id}", None),
            ("PATCH", f"/v1/leases/{lease_id}", {"ttlSeconds": 600}),
            ("POST", f"/v1/leases/{lease_id}/report", {"outcome": "blocked", "target": "x.io"}),
            ("POST", f"/v1/leases/{lease_id}/rotate", None),
            ("DELETE", f"/v1/leases/{lease_id}", None),
        ]
    )
    answer = (await call(port, method, path, body, timeout=2.0, token=HOSTILE_TOKEN))[0]
    if answer.status is None:
        return answer.code or "no answer"
    verdict = "taken" if answer.status < 400 else f"{answer.status} {answer.code}"
    return f"{method} {verdict}"


async def travel_attempt(port: int, rng: random.Random) -> str:
    """A console page as of a past instant, abandoned after a fraction of a second."""
    at = datetime.now(UTC) - timedelta(seconds=rng.uniform(1, 30))
    path = "/ui?at=" + at.strftime("%Y-%m-%dT%H:%M:%S")
    answer = (await call(port, "GET", path, timeout=rng.uniform(0.05, 0.3), token=HOSTILE_TOKEN))[0]
    return str(answer.status) if answer.status is not None else "abandoned"


async def run_hostile(
    port: int,
    origin_port: int,
    proxies: Callable[[], Mapping[str, str]],
    record: Record,
    stop: asyncio.Event,
    *,
    seed: int,
) -> Hostile:
    """Until ``stop``: one hostile action every ``PAUSE``. ``proxies()`` gives the Ready
    proxies' URLs (uid -> url) as the soak currently sees them."""
    rng = random.Random(f"{seed}-hostile")
    seen = Hostile()
    while not stop.is_set():
        kind = rng.choice(("proxy", "lease", "travel"))
        if kind == "proxy" and (urls := list(proxies().values())):
            credential = rng.choice(BAD_CREDENTIALS)
            answer = await proxy_attempt(rng.choice(urls), credential, origin_port)
            seen.proxy_answers[answer] += 1
            if answer == "200":
                seen.taken.append(f"{time.time():.3f} a proxy let {credential[:20]!r} through")
        elif kind == "lease" and (ids := _newest_leases(record)):
            answer = await lease_attempt(port, rng.choice(ids), rng)
            seen.lease_answers[answer] += 1
            if answer.endswith("taken"):
                seen.taken.append(f"{time.time():.3f} another client's lease: {answer}")
        elif kind == "travel":
            seen.travels[await travel_attempt(port, rng)] += 1
        await asyncio.sleep(PAUSE)
    return seen


def _newest_leases(record: Record) -> list[str]:
    return [a.lease_id for a in record.acquisitions[-20:] if a.lease_id]


def check_hostile(seen: Hostile) -> Check:
    attempts = sum(seen.proxy_answers.values()) + sum(seen.lease_answers.values())
    return Check(
        "hostile attempts that took effect",
        float(len(seen.taken)),
        f"0 of {attempts}",
        not seen.taken and attempts > 0,
        tuple(seen.taken[:10]) or (() if attempts else ("the hostile client made no attempt",)),
    )
