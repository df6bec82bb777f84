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
  a second, which the replica must stop folding and bound;
- **forged credentials beside a holder's traffic**: bursts of concurrent requests on a crawler's
  proxy with the crawler's lease id and made-up passwords (``bench.chaos_edge``); each must be
  refused (407), never a 200;
- **requests that leave the crawl**: through a lease of its own, the metadata name, CONNECT to
  the host's ports, ``0.0.0.0``; each must be refused at the proxy, never a 200.

The check is that nothing the hostile client asked for took effect; the soak's other checks
(no lease doubled or lost, every proxy serving at the end) must hold beside it.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from bench.chaos_check import Acquisition, Check
from bench.chaos_edge import Endpoint, escape, escapes, exchange, forge, get
from bench.chaos_load import LoadOptions, Record, acquisition, call, release
from services.runtime.pure.clients import hash_token

CRAWLER_TOKEN = secrets.token_hex(32)
HOSTILE_TOKEN = secrets.token_hex(32)
HOSTILE_HOLDER = "hostile-"
"""The holder names of the hostile client's own leases start so."""
PAUSE = 0.05
KINDS = ("proxy", "lease", "travel", "forge", "escape")
AFTER_STOP = 30.0
"""How long the hostile client goes on after the load stops, trying only the kinds it has not
tried yet: on a loaded machine with few proxies the crawlers can hold every proxy for the whole
soak, and its own lease (the escapes) comes only once they let go. A kind never tried is a check
that proved nothing."""
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
    forged: Counter[str] = field(default_factory=Counter)
    escapes: Counter[str] = field(default_factory=Counter)
    taken: list[str] = field(default_factory=list)
    """Attempts that were not refused: each one is evidence against the system."""

    def untried(self) -> tuple[str, ...]:
        """The kinds of attempt (``KINDS``) that have no answer yet."""
        answered = {
            "proxy": self.proxy_answers,
            "lease": self.lease_answers,
            "travel": self.travels,
            "forge": self.forged,
            "escape": self.escapes,
        }
        return tuple(kind for kind in KINDS if not answered[kind])


async def proxy_attempt(url: str, credential: bytes, origin_port: int) -> str:
    """One request through the proxy at ``url`` with ``credential`` as its Basic login."""
    parts = urlsplit(url)
    request = get(f"127.0.0.1:{origin_port}", credential)
    return await exchange(parts.hostname or "", parts.port or 0, request)


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
    selector: Mapping[str, str] | None = None,
) -> Hostile:
    """Until ``stop``: one hostile action every ``PAUSE``; then, for at most ``AFTER_STOP``,
    only the kinds not tried yet. ``proxies()`` gives the Ready proxies' URLs (uid -> url) as
    the soak currently sees them; ``selector`` is what the hostile client's own leases ask
    for."""
    attacker = Attacker(
        port, origin_port, proxies, record, random.Random(f"{seed}-hostile"), Hostile()
    )
    own = OwnLease(port, dict(selector or {}), record)
    stopped_at: float | None = None
    try:
        while True:
            kinds: tuple[str, ...] = KINDS
            if stop.is_set():
                stopped_at = stopped_at or time.monotonic()
                kinds = attacker.seen.untried()
                if not kinds or time.monotonic() - stopped_at > AFTER_STOP:
                    break
            await attacker.step(own, kinds)
            await asyncio.sleep(PAUSE)
    finally:
        await own.release()
    return attacker.seen


@dataclass
class Attacker:
    """What the hostile client knows: the ports, the proxies the soak sees, the crawlers'
    leases as a ``read`` client would see them."""

    port: int
    origin_port: int
    proxies: Callable[[], Mapping[str, str]]
    record: Record
    rng: random.Random
    seen: Hostile

    async def step(self, own: OwnLease, kinds: tuple[str, ...] = KINDS) -> None:
        rng, seen = self.rng, self.seen
        kind = rng.choice(kinds)
        if kind == "forge" and (held := _held(self.record)):
            await self.forge(rng.choice(held))
        elif kind == "escape" and (endpoint := await own.endpoint()) is not None:
            name = rng.choice(sorted(escapes(self.port)))
            answer = await escape(endpoint, name, self.port)
            seen.escapes[f"{name}: {answer}"] += 1
            if answer == "200":
                seen.taken.append(f"{time.time():.3f} the proxy let its holder reach the {name}")
        elif kind == "proxy" and (urls := list(self.proxies().values())):
            credential = rng.choice(BAD_CREDENTIALS)
            answer = await proxy_attempt(rng.choice(urls), credential, self.origin_port)
            seen.proxy_answers[answer] += 1
            if answer == "200":
                seen.taken.append(f"{time.time():.3f} a proxy let {credential[:20]!r} through")
        elif kind == "lease" and (ids := _newest_leases(self.record)):
            answer = await lease_attempt(self.port, rng.choice(ids), rng)
            seen.lease_answers[answer] += 1
            if answer.endswith("taken"):
                seen.taken.append(f"{time.time():.3f} another client's lease: {answer}")
        elif kind == "travel":
            seen.travels[await travel_attempt(self.port, rng)] += 1

    async def forge(self, target: Acquisition) -> None:
        endpoint = Endpoint.of(target.proxy_url)
        if endpoint is None:
            return
        for credential, answer in await forge(endpoint, target.lease_id, self.origin_port):
            self.seen.forged[answer] += 1
            if answer == "200":
                self.seen.taken.append(f"{time.time():.3f} a forged {credential[:40]!r} passed")


def _held(record: Record) -> list[Acquisition]:
    """The crawlers' newest leases still current, with a proxy URL to forge on."""
    now = time.time()
    recent = _crawlers(record.acquisitions[-20:])
    return [a for a in recent if a.proxy_url and a.expires_at > now + 1.0]


class OwnLease:
    """The hostile client's own lease, for the requests that would leave the crawl: acquired
    when needed, taken again before it expires, released at the end. Its acquisitions and
    releases go into the soak's record like the crawlers', so the checks of the log account
    for them (a lease the checker cannot trace to a request is a ghost)."""

    def __init__(self, port: int, selector: dict[str, str], record: Record) -> None:
        self.port = port
        self.selector = selector
        self.record = record
        self.options = LoadOptions(token=HOSTILE_TOKEN, timeout=5.0)
        self.lease_id = ""
        self.url = ""
        self.expires_at = 0.0
        self.n = 0

    async def endpoint(self) -> Endpoint | None:
        if self.lease_id and self.expires_at > time.time() + 2.0:
            return Endpoint.of(self.url)
        await self.release()
        self.n += 1
        holder = f"{HOSTILE_HOLDER}{self.n}"
        body = {"ttlSeconds": 20, "holder": holder, "selector": self.selector}
        answer, parsed, _ = await call(
            self.port, "POST", "/v1/leases", body, timeout=5.0, token=HOSTILE_TOKEN
        )
        got = acquisition(holder, answer, parsed)
        self.record.acquisitions.append(got)
        if not got.lease_id:
            return None
        self.lease_id, self.url, self.expires_at = got.lease_id, got.proxy_url, got.expires_at
        return Endpoint.of(self.url)

    async def release(self) -> None:
        if self.lease_id:
            await release(self.port, self.lease_id, self.options, self.record)
        self.lease_id = ""


def _newest_leases(record: Record) -> list[str]:
    return [a.lease_id for a in _crawlers(record.acquisitions[-20:]) if a.lease_id]


def _crawlers(acquisitions: list[Acquisition]) -> list[Acquisition]:
    """The crawlers' acquisitions: the hostile client's own are in the record too."""
    return [a for a in acquisitions if not a.holder.startswith(HOSTILE_HOLDER)]


def check_hostile(seen: Hostile) -> Check:
    attempts = sum(
        sum(counts.values())
        for counts in (seen.proxy_answers, seen.lease_answers, seen.forged, seen.escapes)
    )
    return Check(
        "hostile attempts that took effect",
        float(len(seen.taken)),
        f"0 of {attempts}",
        not seen.taken and attempts > 0,
        tuple(seen.taken[:10]) or (() if attempts else ("the hostile client made no attempt",)),
    )
