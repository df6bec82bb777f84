"""Reading an upstream instance's access log into meter records
(docs/decisions/0161-metering-upstream-bytes.md). Pure: the bytes, the range they were read
from and the clock's readings are handed in.

A line is ``METER_FIELDS`` (``squidconf``): ``<seconds>.<ms> <bytes up> <bytes down> <result>
<lease>``. Squid writes it, but what it holds came from outside (a note is the helper's word, a
size a count of what a crawler sent), and a file can be cut short or written to by hand: every
line that is not exactly that shape is skipped and counted by reason, never an exception. A
request Squid refused itself (``TCP_DENIED``: no or a wrong credential) never reached the
service, which bills nothing for it, so it is counted apart and not metered; nor is a line of
no bytes (a connection that ended before its request: the provider's own port check).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from events.meter import MAX_BYTES, MAX_COUNT, MAX_INTERVAL_SECONDS, UpstreamMetered
from events.store import NewEvent, derive_msg_id

MAX_LINE = 512
"""Bytes of one line, its end included; a real one has fewer than 100."""
NO_LEASE = b"-"
LEASE_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}\Z")
"""A lease id a note can carry (``NOTE_CHARACTERS`` of the lease helper)."""
_TIME = re.compile(rb"[0-9]{1,12}\.[0-9]{3}\Z")
_SIZE = re.compile(rb"[0-9]{1,16}\Z")
_RESULT = re.compile(rb"[A-Z_]{1,40}\Z")
DENIED = b"TCP_DENIED"

SKIP_REASONS = ("long", "garbage", "lease", "empty")
"""Why a line was skipped: longer than ``MAX_LINE``, not the format, a lease id no credential
could carry, nothing moved (a connection closed before its request, such as a port check)."""


@dataclass(slots=True)
class Usage:
    requests: int = 0
    bytes_up: int = 0
    bytes_down: int = 0

    def add(self, up: int, down: int) -> None:
        self.requests = min(self.requests + 1, MAX_COUNT)
        self.bytes_up = min(self.bytes_up + up, MAX_BYTES)
        self.bytes_down = min(self.bytes_down + down, MAX_BYTES)


@dataclass(slots=True)
class Tally:
    """What a range of lines held: usage per lease id (``""``: none), the lines Squid denied,
    and the lines skipped per reason."""

    usage: dict[str, Usage] = field(default_factory=dict)
    denied: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str, count: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + count


def parse_line(line: bytes, tally: Tally) -> None:
    """Count one line (without its end) into ``tally``."""
    if len(line) >= MAX_LINE:
        tally.skip("long")
        return
    words = line.split(b" ")
    if len(words) != 5:
        tally.skip("garbage")
        return
    when, up, down, result, lease = words
    if not (_TIME.match(when) and _SIZE.match(up) and _SIZE.match(down) and _RESULT.match(result)):
        tally.skip("garbage")
        return
    if result.startswith(DENIED):
        tally.denied += 1
        return
    if lease != NO_LEASE and not LEASE_ID.match(lease):
        tally.skip("lease")
        return
    sent, received = min(int(up), MAX_BYTES), min(int(down), MAX_BYTES)
    if not sent and not received:
        tally.skip("empty")
        return
    key = "" if lease == NO_LEASE else lease.decode("ascii")
    tally.usage.setdefault(key, Usage()).add(sent, received)


@dataclass(frozen=True, slots=True)
class Chunk:
    """The lines of ``data`` that ``split`` takes: ``used`` bytes of it (whole lines), and
    whether the first of them was the rest of a long line, to be dropped."""

    lines: list[bytes]
    used: int
    skipping: bool
    """Whether the read ended inside a line longer than ``MAX_LINE``: its rest, up to the next
    line end, is dropped by the next read."""


def split(data: bytes, *, skipping: bool, final: bool) -> Chunk:
    """The whole lines at the start of ``data``. A line without its end yet is left for the
    next read, unless it is already too long (taken, and its rest skipped when it comes) or the
    file is ``final`` (no more will be written: taken as it is). ``skipping``: ``data`` begins
    with the rest of a long line, dropped up to its end."""
    start = 0
    lines: list[bytes] = []
    if skipping:
        end = data.find(b"\n")
        if end < 0:
            return Chunk([], len(data), not final)
        start = end + 1
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            rest = data[start:]
            if final:
                lines.append(rest)
                return Chunk(lines, len(data), False)
            if len(rest) >= MAX_LINE:
                lines.append(rest[:MAX_LINE])
                return Chunk(lines, len(data), True)
            return Chunk(lines, start, False)
        lines.append(data[start:end])
        start = end + 1
    return Chunk(lines, start, False)


def tally(lines: Iterable[bytes]) -> Tally:
    result = Tally()
    for line in lines:
        if line.strip():
            parse_line(line, result)
    return result


@dataclass(frozen=True, slots=True)
class Source:
    """Where a range was read: the entry, the instance (its uid), the proxy it serves, and the
    log file's generation (the meter's count of files it has read for the instance)."""

    provider: str
    instance_uid: str
    proxy_uid: str
    generation: int
    budget_bytes_per_day: int = 0


def records(
    source: Source,
    counted: Tally,
    *,
    first: int,
    end: int,
    replica: str,
    start: datetime,
    interval: float,
) -> list[NewEvent]:
    """One ``UpstreamMetered`` per lease that moved anything in bytes ``[first, end)`` of the
    source's file. The message id is the range's, never the clock's: the same range read again
    (after a crash between the append and the saved offset) is the same message, which the
    stream drops as a duplicate."""
    length = min(max(interval, 0.001), MAX_INTERVAL_SECONDS)
    made = []
    for lease_id in sorted(counted.usage):
        usage = counted.usage[lease_id]
        event = UpstreamMetered(
            provider=source.provider,
            replica=replica,
            start=start,
            interval_seconds=length,
            proxy_uid=source.proxy_uid,
            lease_id=lease_id,
            requests=usage.requests,
            bytes_up=usage.bytes_up,
            bytes_down=usage.bytes_down,
            budget_bytes_per_day=source.budget_bytes_per_day,
        )
        msg_id = derive_msg_id(
            "meter",
            source.provider,
            source.instance_uid,
            str(source.generation),
            str(first),
            str(end),
            lease_id,
        )
        made.append(NewEvent(event, msg_id))
    return made
