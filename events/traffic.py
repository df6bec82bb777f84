"""The traffic stream (``traffic.<client>``): what the gateway relayed, per interval
(docs/decisions/0158-traffic-records.md).

Each gateway replica counts, per client, proxy and lease, the requests, tunnels, bytes and
outcomes it relayed, by target host, and every interval appends one ``TrafficRecorded`` per
(client, proxy, lease) it relayed anything for. A record holds at most ``MAX_ROWS`` hosts (the
busiest by bytes) and one ``OTHER`` row for the rest, so a crawl over a million hosts writes
records of bounded size.

Part of the one tagged union ``events.schemas`` defines; the rules there (new fields take
defaults) hold here. ``problem`` is the one judgement of a record's values: the codec refuses to
write a record it finds fault with, and the fold (``projections.traffic``) skips and counts one
it meets in the log.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import re
from datetime import datetime
from typing import ClassVar

import msgspec

from events.base import Event

MAX_ROWS = 32
"""Hosts a record names one by one; the others are summed in the ``OTHER`` row."""
OTHER = "*"
"""The host of the row that sums every host a record does not name (and hosts no rule allows)."""
MAX_HOST = 253
MAX_COUNT = 1_000_000_000
"""Requests (or any per-request count) one record may hold: a billion in one interval is no
gateway's, only a writer's bug or a forgery."""
MAX_BYTES = 2**53 - 1
"""Bytes one row may hold: the largest integer every JSON reader keeps exact (8 PiB)."""
MAX_INTERVAL_SECONDS = 3600.0
MAX_NAME = 128
COUNTS = (
    "requests",
    "tunnels",
    "status_2xx",
    "status_3xx",
    "status_4xx",
    "status_5xx",
    "blocked",
    "failed",
)
"""A row's per-request counts (bounded by ``MAX_COUNT``); its bytes are bounded apart."""

_LABELS = re.compile(
    r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z"
)
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}\Z")
_NAME = re.compile(r"[\x21-\x7e]{1,128}\Z")
"""A client, proxy uid, lease id or replica: printable ASCII without spaces."""


class TrafficRow(msgspec.Struct, frozen=True, kw_only=True):
    """One target host's share of a record (``OTHER``: the hosts the record does not name)."""

    host: str
    requests: int = 0
    """Plain HTTP requests and CONNECT tunnels, each attempt (a retried request counts twice)."""
    tunnels: int = 0
    """Of ``requests``, the CONNECT tunnels."""
    bytes_up: int = 0
    """Sent to the site: request bodies, and what a crawler wrote into a tunnel."""
    bytes_down: int = 0
    """Sent to the crawler: response heads and bodies, and what came out of a tunnel."""
    status_2xx: int = 0
    status_3xx: int = 0
    status_4xx: int = 0
    status_5xx: int = 0
    blocked: int = 0
    """Answered with one of the gateway's block codes, or a tunnel the proxy refused with one."""
    failed: int = 0
    """No answer: the proxy or the site could not be reached."""


class TrafficRecorded(Event, frozen=True, kw_only=True):
    """What one gateway replica relayed for one client through one lease over one interval."""

    category: ClassVar[str] = "traffic"
    client: str
    """The client's name (its label when the gateway is open)."""
    replica: str
    """The gateway replica that counted it."""
    start: datetime
    """When the interval began, by the replica's clock (UTC)."""
    interval_seconds: float
    proxy_uid: str
    lease_id: str
    proxy: str = ""
    """``namespace/name``, as the lease named it then."""
    rows: tuple[TrafficRow, ...] = ()
    """The busiest hosts by bytes (at most ``MAX_ROWS``), then ``OTHER`` if any were left."""


def client_key(client: str) -> str:
    """The subject token of a client's records (``traffic.<key>``): its name when that is one,
    else a digest of it (client names may hold dots, which split subjects). The record names the
    client in full; the key only partitions the stream so one client's records read alone."""
    if _TOKEN.match(client):
        return client
    return "h-" + hashlib.blake2b(client.encode(), digest_size=10).hexdigest()


def name_problem(text: str) -> str | None:
    """Why ``text`` cannot be a record's client, replica, proxy uid or lease id, or None."""
    if not _NAME.match(text):
        return f"1-{MAX_NAME} printable ASCII characters without spaces"
    return None


def host_problem(host: str) -> str | None:
    """Why ``host`` cannot be a row's host, or None: the rule the discovery API holds a lease's
    ``target`` to (docs/decisions/0139-the-discovery-api-s-edges.md), for a host already in its
    stored form: lower case, ASCII (IDNA), no trailing dot, an IPv6 address without brackets."""
    if host == OTHER:
        return None
    if not host or len(host) > MAX_HOST:
        return f"a host is 1-{MAX_HOST} characters"
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"{host[:100]!r} is no IPv6 address"
        return None
    if host.replace(".", "").isdigit():
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"{host[:100]!r} is no IPv4 address"
        return None
    if not _LABELS.match(host):
        return f"{host[:100]!r} is not lower-case labels of letters, digits and inner hyphens"
    if host.rsplit(".", 1)[-1].isdigit():
        return f"{host[:100]!r}: a host name's last label is not all digits"
    return None


def row_problem(row: TrafficRow) -> str | None:
    why = host_problem(row.host)
    if why is not None:
        return why
    for name in COUNTS:
        value = getattr(row, name)
        if type(value) is not int or not 0 <= value <= MAX_COUNT:
            return f"{row.host}: {name} {value!r} is not an integer from 0 to {MAX_COUNT}"
    for name in ("bytes_up", "bytes_down"):
        value = getattr(row, name)
        if type(value) is not int or not 0 <= value <= MAX_BYTES:
            return f"{row.host}: {name} {value!r} is not an integer from 0 to {MAX_BYTES}"
    if row.tunnels > row.requests:
        return f"{row.host}: more tunnels than requests"
    statuses = row.status_2xx + row.status_3xx + row.status_4xx + row.status_5xx
    if statuses + row.failed > row.requests:
        return f"{row.host}: more answers and failures than requests"
    return None


def problem(event: TrafficRecorded) -> str | None:
    """What makes the record one no fold can use, or None."""
    for name in ("client", "replica", "proxy_uid", "lease_id"):
        why = name_problem(getattr(event, name))
        if why is not None:
            return f"{name}: {why}"
    if len(event.proxy) > 2 * MAX_HOST or not event.proxy.isprintable():
        return "proxy: at most 506 printable characters"
    if event.start.tzinfo is None:
        return "start: a time with its zone"
    interval = event.interval_seconds
    if not math.isfinite(interval) or not 0 < interval <= MAX_INTERVAL_SECONDS:
        return f"interval_seconds: {interval!r} is not in (0, {MAX_INTERVAL_SECONDS:g}]"
    if len(event.rows) > MAX_ROWS + 1:
        return f"rows: {len(event.rows)}, more than {MAX_ROWS} hosts and {OTHER!r}"
    hosts = [row.host for row in event.rows]
    if len(set(hosts)) != len(hosts):
        return "rows: a host twice"
    for row in event.rows:
        why = row_problem(row)
        if why is not None:
            return f"rows: {why}"
    return None
