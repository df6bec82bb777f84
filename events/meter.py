"""The meter stream (``meter.<provider>``): the bytes that passed through the chaining proxies of
an upstream provider entry, per proxy and lease, per interval (docs/providers.md, "upstream").

Proxy services bill per byte. The Squid of ours that chains each session to its service logs
every request and tunnel with the lease it served; the executor that runs those Squids reads
their logs and appends, every interval, one ``UpstreamMetered`` per (proxy, lease) that moved
anything. Each record carries the entry's daily budget as configured when it was written, so a
reader judges a spent budget from the log alone, without the providers config.

Part of the one tagged union ``events.schemas`` defines (new fields take defaults). ``problem``
is the one judgement of a record's values: the codec refuses to write a record it finds fault
with, and every fold skips and counts one it meets in the log.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import ClassVar

from events.base import Event

MAX_COUNT = 1_000_000_000
MAX_BYTES = 2**53 - 1
"""Bytes one record may hold: the largest integer every JSON reader keeps exact (8 PiB)."""
MAX_INTERVAL_SECONDS = 3600.0
_PROVIDER = re.compile(r"[A-Za-z0-9_-]{1,63}\Z")
"""The rule of a provider entry's name (services/providers/config.py)."""
_NAME = re.compile(r"[\x21-\x7e]{1,128}\Z")
"""A replica, proxy uid or lease id: printable ASCII without spaces."""


class UpstreamMetered(Event, frozen=True, kw_only=True):
    """What one upstream proxy's chaining Squid moved for one lease over one interval."""

    category: ClassVar[str] = "meter"
    provider: str
    """The provider entry's name (``spec.provider`` of the proxies it runs)."""
    replica: str
    """The executor that read the log."""
    start: datetime
    """When the interval began, by the replica's clock (UTC)."""
    interval_seconds: float
    proxy_uid: str
    lease_id: str = ""
    """Empty for what no lease made (the health prober's requests)."""
    requests: int = 0
    """Plain requests and CONNECT tunnels, each logged once when it ended."""
    bytes_up: int = 0
    """Received from the crawler (request heads and bodies, what it wrote into tunnels)."""
    bytes_down: int = 0
    """Sent to the crawler."""
    budget_bytes_per_day: int = 0
    """The entry's ``maxBytesPerDay`` when the record was written; 0: no budget."""


def problem(event: UpstreamMetered) -> str | None:
    """What makes the record one no fold can use, or None."""
    if not _PROVIDER.match(event.provider):
        return "provider: 1-63 letters, digits, '_' or '-'"
    for name in ("replica", "proxy_uid"):
        if not _NAME.match(getattr(event, name)):
            return f"{name}: 1-128 printable ASCII characters without spaces"
    if event.lease_id and not _NAME.match(event.lease_id):
        return "lease_id: empty, or 1-128 printable ASCII characters without spaces"
    if event.start.tzinfo is None:
        return "start: a time with its zone"
    interval = event.interval_seconds
    if not math.isfinite(interval) or not 0 < interval <= MAX_INTERVAL_SECONDS:
        return f"interval_seconds: {interval!r} is not in (0, {MAX_INTERVAL_SECONDS:g}]"
    if type(event.requests) is not int or not 0 <= event.requests <= MAX_COUNT:
        return f"requests: {event.requests!r} is not an integer from 0 to {MAX_COUNT}"
    for name in ("bytes_up", "bytes_down", "budget_bytes_per_day"):
        value = getattr(event, name)
        if type(value) is not int or not 0 <= value <= MAX_BYTES:
            return f"{name}: {value!r} is not an integer from 0 to {MAX_BYTES}"
    return None
