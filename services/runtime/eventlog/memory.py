"""An in-memory event store with the JetStream store's semantics, for tests and the fakes.

It encodes and decodes through the same codec, checks the same per-aggregate sequence, and
de-duplicates by msg id, so a test that passes here exercises the same contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from events import codec, reading
from events.errors import ConcurrencyError
from events.store import AppendResult, History, NewEvent, Recorded
from events.subjects import Aggregate, subject_matches
from services.runtime.eventlog.skipped import LEDGER


@dataclass(frozen=True, slots=True)
class _Stored:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    timestamp: datetime


class InMemoryEventStore:
    def __init__(self) -> None:
        self._streams: dict[str, list[_Stored]] = {}
        self._ids: dict[tuple[str, str], int] = {}

    def _last_seq(self, aggregate: Aggregate) -> int:
        for stored in reversed(self._streams.get(aggregate.stream, [])):
            if subject_matches(aggregate.filter_subject, stored.subject):
                return stored.seq
        return 0

    def _first_after(self, aggregate: Aggregate, seq: int) -> _Stored | None:
        for stored in self._streams.get(aggregate.stream, []):
            if stored.seq > seq and subject_matches(aggregate.filter_subject, stored.subject):
                return stored
        return None

    async def append(
        self,
        aggregate: Aggregate,
        events: Sequence[NewEvent],
        expected_seq: int | None = None,
    ) -> AppendResult:
        # No await below: the append is atomic on the event loop. Every event is encoded before
        # any is stored, as the JetStream store does: one that cannot be leaves none of them.
        encoded = [(new, codec.encode(new.event)) for new in events]
        seqs: list[int] = []
        duplicates = 0
        expected = expected_seq
        for new, data in encoded:
            if expected is not None and self._last_seq(aggregate) != expected:
                # What JetStream's store does on 10071: an event already stored right after
                # the expected sequence with the same msg id is our own earlier attempt.
                following = self._first_after(aggregate, expected)
                if following is None or following.headers.get(codec.HDR_MSG_ID) != new.msg_id:
                    raise ConcurrencyError(str(aggregate), expected)
                seq, duplicate = following.seq, True
            else:
                seq, duplicate = self._store(aggregate, new, data)
            seqs.append(seq)
            duplicates += duplicate
            expected = None if expected is None else seq
        return AppendResult(seqs=seqs, duplicates=duplicates)

    def _store(self, aggregate: Aggregate, new: NewEvent, data: bytes) -> tuple[int, bool]:
        known = self._ids.get((aggregate.stream, new.msg_id))
        if known is not None:
            return known, True
        stream = self._streams.setdefault(aggregate.stream, [])
        seq = (stream[-1].seq if stream else 0) + 1
        headers = codec.envelope_headers(new.event, new.msg_id, new.causation_id)
        stream.append(
            _Stored(
                seq=seq,
                subject=aggregate.subject_for(new.event),
                data=data,
                headers=headers,
                timestamp=datetime.now(UTC),
            )
        )
        self._ids[(aggregate.stream, new.msg_id)] = seq
        return seq, False

    async def read(self, aggregate: Aggregate, after_seq: int = 0) -> History:
        events: list[Recorded] = []
        last = 0
        skipped = 0
        for stored in self._streams.get(aggregate.stream, []):
            if not subject_matches(aggregate.filter_subject, stored.subject):
                continue
            last = stored.seq
            if stored.seq <= after_seq:
                continue
            item, skip = reading.recorded(
                aggregate.stream,
                stored.seq,
                stored.subject,
                stored.timestamp,
                stored.data,
                stored.headers,
            )
            if skip is not None:
                skipped += 1
                LEDGER.note(skip)
                continue
            events.append(item)
        return History(events=events, last_seq=last, skipped=skipped)

    def raw_append(self, stream: str, subject: str, data: bytes, headers: dict[str, str]) -> int:
        """Store bytes as they are: for tests of unknown types and poison payloads."""
        stored = self._streams.setdefault(stream, [])
        seq = (stored[-1].seq if stored else 0) + 1
        stored.append(_Stored(seq, subject, data, dict(headers), datetime.now(UTC)))
        return seq
