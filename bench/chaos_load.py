"""The lease load of the chaos soak: crawlers that acquire, hold, report and release.

Each request opens a connection of its own. On a kept-alive connection to a replica that was
killed, the next request goes into a dead socket, and a request the server never saw would
look like one whose answer was lost. With one connection per request, "refused, nothing sent"
and "sent, no answer" stay apart, and that is the line between a failure the client knows of
and an ambiguity it cannot resolve.

Every acquire names a holder no other request uses, and every report a detail no other report
uses, so the checker can trace each write in the log back to the request that made it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bench.chaos_check import BUSY, OK, Acquisition, Answer, Call
from bench.chaos_edge import Endpoint, use

HOST = "127.0.0.1"
CONNECT_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class LoadOptions:
    clients: int = 8
    ttl: float = 20.0
    """Short, so a lease whose release never got through frees its proxy within the run."""
    hold: tuple[float, float] = (0.02, 0.2)
    report_share: float = 0.3
    timeout: float = 15.0
    """Per request: above the API's own waits (the append timeout, the view's wait)."""
    pause: float = 0.5
    """After an error without ``Retry-After``."""
    max_retry_after: float = 2.0
    release_attempts: int = 5
    selector: dict[str, str] = field(default_factory=dict)
    token: str = ""
    """The crawlers' bearer token ("" for an API without clients)."""
    origin_port: int = 0
    """Where holders send requests through their proxies while they hold them (0: they send
    none): the traffic a forged credential lands beside (``bench.chaos_edge``)."""
    uses: int = 2
    """Requests through the proxy per lease held."""


@dataclass
class Record:
    """Everything the clients were told, in the order they were told it."""

    acquisitions: list[Acquisition] = field(default_factory=list)
    releases: list[Call] = field(default_factory=list)
    reports: list[Call] = field(default_factory=list)
    uses: Counter[str] = field(default_factory=Counter)
    """The holders' requests through their proxies, by status; a 407 there is a holder refused
    while its lease was current (or withdrawn under it: the checks of the log tell which)."""


async def call(
    port: int, method: str, path: str, body: object = None, *, timeout: float, token: str = ""
) -> tuple[Answer, dict[str, Any], dict[str, str]]:
    """One request on a fresh connection: the answer, its JSON body, its headers."""
    sent_at = time.time()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(HOST, port), CONNECT_TIMEOUT
        )
    except (OSError, TimeoutError) as exc:
        return Answer(sent_at, code=type(exc).__name__, sent=False), {}, {}
    data = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: chaos\r\nConnection: close\r\n"
    head += f"Content-Length: {len(data)}\r\n"
    if body is not None:
        head += "Content-Type: application/json\r\n"
    if token:
        head += f"Authorization: Bearer {token}\r\n"
    headers: dict[str, str] = {}
    try:
        async with asyncio.timeout(timeout):
            writer.write(head.encode() + b"\r\n" + data)
            await writer.drain()
            status_line = await reader.readline()
            if not status_line:
                raise ConnectionResetError("closed before answering")
            status = int(status_line.split(b" ", 2)[1])
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            payload = await reader.readexactly(length) if length else b""
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
        return Answer(sent_at, code=type(exc).__name__), {}, {}
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    try:
        parsed = json.loads(payload) if payload else {}
    except ValueError:
        parsed = {}
    parsed = parsed if isinstance(parsed, dict) else {}
    code = str(parsed.get("error", "")) if status >= 400 else ""
    return Answer(sent_at, time.time(), status, code), parsed, headers


def stamp(text: object) -> float:
    """An RFC 3339 time of the API as seconds since the epoch."""
    return datetime.fromisoformat(str(text)).timestamp()


def acquisition(holder: str, answer: Answer, body: dict[str, Any]) -> Acquisition:
    if answer.outcome != OK:
        return Acquisition(holder, answer)
    try:
        return Acquisition(
            holder,
            answer,
            lease_id=str(body["id"]),
            proxy_uid=str(body["proxy"]["uid"]),
            acquired_at=stamp(body["acquiredAt"]),
            expires_at=stamp(body["expiresAt"]),
            token=int(body["fencingToken"]),
            proxy_url=str(body["proxy"].get("url", "")),
        )
    except (KeyError, TypeError, ValueError):
        # A 201 the client cannot use: recorded as such, the checker then finds no such lease.
        return Acquisition(holder, answer)


def backoff(answer: Answer, headers: dict[str, str], options: LoadOptions) -> float:
    """``Retry-After`` when the API gives one (capped: the soak is short), else a pause."""
    try:
        return min(float(headers["retry-after"]), options.max_retry_after)
    except (KeyError, ValueError):
        return options.pause if answer.outcome != BUSY else options.max_retry_after


async def release(port: int, lease_id: str, options: LoadOptions, record: Record) -> None:
    """Until the API says the lease is over: 204, or 404 (docs/api.md: a retried DELETE may
    see 404 when an earlier attempt got through). Gives up after ``release_attempts``; the
    lease then ends at its ``expiresAt``."""
    for _ in range(options.release_attempts):
        path = f"/v1/leases/{lease_id}"
        answer = (await call(port, "DELETE", path, timeout=options.timeout, token=options.token))[0]
        record.releases.append(Call(lease_id, answer))
        if answer.outcome == OK or answer.status == 404:
            return
        await asyncio.sleep(options.pause)


async def hold(got: Acquisition, options: LoadOptions, record: Record, rng: random.Random) -> None:
    """The lease's hold: requests through its proxy when the soak has an origin, then the rest
    of the hold time."""
    until = time.monotonic() + rng.uniform(*options.hold)
    endpoint = Endpoint.of(got.proxy_url) if options.origin_port else None
    if endpoint is not None:
        for _ in range(options.uses):
            record.uses[await use(endpoint, options.origin_port)] += 1
    await asyncio.sleep(max(0.0, until - time.monotonic()))


async def crawler(
    name: str,
    port: int,
    options: LoadOptions,
    record: Record,
    *,
    stop: asyncio.Event,
    rng: random.Random,
) -> None:
    """Acquire, hold, maybe report, release; again until ``stop``. The release goes on in the
    background while the crawler asks for its next proxy, as a crawler that does not wait on
    housekeeping would: so acquisitions keep coming while the log is down, not only releases.
    Every lease a crawler got is released (or retried until the attempts run out) before it
    returns."""
    releasing: set[asyncio.Task[None]] = set()
    n = 0
    while not stop.is_set():
        n += 1
        holder = f"{name}-{n}"
        body = {"ttlSeconds": options.ttl, "holder": holder, "selector": options.selector}
        answer, parsed, headers = await call(
            port, "POST", "/v1/leases", body, timeout=options.timeout, token=options.token
        )
        got = acquisition(holder, answer, parsed)
        record.acquisitions.append(got)
        if not got.lease_id:
            await asyncio.sleep(backoff(answer, headers, options))
            continue
        await hold(got, options, record, rng)
        if rng.random() < options.report_share:
            tag = f"{holder}-report"
            report = {"outcome": "success", "target": "chaos.example", "detail": tag}
            path = f"/v1/leases/{got.lease_id}/report"
            answer = (
                await call(port, "POST", path, report, timeout=options.timeout, token=options.token)
            )[0]
            record.reports.append(Call(got.lease_id, answer, tag))
        task = asyncio.create_task(release(port, got.lease_id, options, record))
        releasing.add(task)
        task.add_done_callback(releasing.discard)
    await asyncio.gather(*releasing)


async def run_load(
    port: int,
    options: LoadOptions,
    stop: asyncio.Event,
    *,
    seed: int,
    run_id: str,
    record: Record | None = None,
) -> Record:
    """Until ``stop`` is set, then until every crawler has finished its cycle; into ``record``
    if given (others may read it meanwhile)."""
    record = record if record is not None else Record()
    await asyncio.gather(
        *(
            crawler(
                f"{run_id}-c{i}", port, options, record, stop=stop, rng=random.Random(f"{seed}-{i}")
            )
            for i in range(options.clients)
        )
    )
    return record
