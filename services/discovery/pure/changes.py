"""Which rows changed since a version, and when rows change with no event: what lets a reader of
discovery's views (the console's fleet poll) do work in proportion to the changes, not the fleet
(docs/decisions/0164-a-change-index-for-the-fleet-poll.md).

``ChangeIndex`` gives every change a version, one higher than the last, and keeps each uid
once, at its newest version, in version order: "which uids changed since ``v``" walks back from
the newest until it meets ``v``. It keeps at most ``keep`` uids (the oldest go first); a reader
whose version is older than what was dropped, or newer than any given (another process's, or
one of before a restart), is told so (None) and reads the whole table.

``DueTimes`` holds the instant each uid's row next changes by itself (a lease's end, a
cooldown's, a back-off's: ``fleet_page.boundary``) in a heap, so the uids due by ``now`` come
out in time proportional to their number. A uid's newer instant replaces its older one; the
older stays in the heap until it surfaces and is skipped (the heap is rebuilt when stale
entries outnumber live ones).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from datetime import datetime

KEEP = 1 << 16
"""The uids a change index keeps by default (about 8 MB; removed ones count until dropped). A
reader needs only the uids changed between two of its reads, a poll's 2 s apart; one that fell
further behind reads every view again, as on its first read."""


class ChangeIndex:
    def __init__(self, keep: int = KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep: {keep}; keep at least one uid")
        self.keep = keep
        self.version = 0
        """The newest change's version (0: none yet)."""
        self.floor = 0
        """The newest version dropped to stay within ``keep``: a reader older than it has lost
        changes and must read everything."""
        self._at: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._at)

    def touch(self, uid: str) -> int:
        """Record a change of ``uid``; its new version."""
        self.version += 1
        at = self._at
        if uid in at:
            at.move_to_end(uid)
        at[uid] = self.version
        while len(at) > self.keep:
            _, dropped = at.popitem(last=False)
            self.floor = dropped
        return self.version

    def version_of(self, uid: str) -> int | None:
        """The version of ``uid``'s newest change still kept, or None."""
        return self._at.get(uid)

    def since(self, version: int) -> list[str] | None:
        """The uids changed after ``version``, newest first; None when ``version`` is not one
        this index can answer for (older than its floor, or newer than its newest)."""
        if version < self.floor or version > self.version:
            return None
        out: list[str] = []
        at = self._at
        for uid in reversed(at):
            if at[uid] <= version:
                break
            out.append(uid)
        return out


class DueTimes:
    def __init__(self) -> None:
        self._heap: list[tuple[datetime, int, str]] = []
        self._due: dict[str, tuple[datetime, int]] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self._due)

    def when(self, uid: str) -> datetime | None:
        got = self._due.get(uid)
        return got[0] if got is not None else None

    def set(self, uid: str, when: datetime | None) -> None:
        """``uid`` next changes at ``when`` (None: at no known instant), replacing any earlier
        setting."""
        current = self._due.get(uid)
        if when is None:
            if current is not None:
                del self._due[uid]
            return
        if current is not None and current[0] == when:
            return
        self._seq += 1
        self._due[uid] = (when, self._seq)
        heapq.heappush(self._heap, (when, self._seq, uid))
        if len(self._heap) > 2 * len(self._due) + 64:
            self._heap = [(w, s, u) for u, (w, s) in self._due.items()]
            heapq.heapify(self._heap)

    def pop_due(self, now: datetime) -> list[str]:
        """The uids whose instant is at or before ``now``, soonest first; each is forgotten
        (its next instant is set again when its row is rebuilt)."""
        out: list[str] = []
        heap, due = self._heap, self._due
        while heap and heap[0][0] <= now:
            when, seq, uid = heapq.heappop(heap)
            if due.get(uid) == (when, seq):
                del due[uid]
                out.append(uid)
        return out
