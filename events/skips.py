"""Events no reader could use: counted, reported once, and never allowed to stop a reader.

The log is immutable, so a bad event (a poison payload, a value a fold cannot apply) stays for the
stream's whole retention. Every reader that meets one skips it and notes it here; the count is
exported as ``egress_events_skipped_total{stream,type,reason}`` and each event is logged once per
process, however many times it is read again (docs/architecture.md, "What the log accepts, and
what survives a bad event").

Pure bookkeeping: no I/O. The reader that notes a skip does the logging when ``note`` says the
event is new to this process.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

UNDECODABLE = "undecodable"
"""The payload is not JSON, or not a valid event of its type."""
UNKNOWN_TYPE = "unknown_type"
"""A type this build does not know (a newer writer): skipped by design, counted all the same."""
UNUSABLE = "unusable"
"""It decoded, but the fold could not apply it (an overflow, a broken invariant)."""

REASONS = (UNDECODABLE, UNKNOWN_TYPE, UNUSABLE)


@dataclass(frozen=True, slots=True)
class Skip:
    stream: str
    subject: str
    seq: int
    event_type: str
    reason: str
    detail: str = ""

    def fields(self) -> dict[str, object]:
        """Log fields: enough to find the event with ``egress-proxies events`` or the nats CLI."""
        return {
            "stream": self.stream,
            "subject": self.subject,
            "seq": self.seq,
            "event_type": self.event_type,
            "reason": self.reason,
            "detail": self.detail,
        }


class SkipLedger:
    """Counts skips by (stream, type, reason), each stored event once.

    Every aggregate read meets the same bad event again; counting it each time would make the
    metric a measure of read traffic, not of bad events. The ledger remembers the most recent
    ``remember`` events it has seen, which bounds its memory whatever the log holds.
    """

    def __init__(self, remember: int = 10_000) -> None:
        self.remember = remember
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self._seen: OrderedDict[tuple[str, int, str], None] = OrderedDict()

    def note(self, skip: Skip) -> bool:
        """Record ``skip``; True when this process had not seen that event skipped before."""
        key = (skip.stream, skip.seq, skip.reason)
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = None
        if len(self._seen) > self.remember:
            self._seen.popitem(last=False)
        self.counts[(skip.stream, skip.event_type or "?", skip.reason)] += 1
        return True

    def total(self) -> int:
        return sum(self.counts.values())
