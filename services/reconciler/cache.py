"""The cache of folded views (``view``) a reconcile starts folding from: a proxy's state as of a
sequence, so that a decision reads only the events after it rather than the proxy's whole
history (docs/architecture.md, "Snapshots").

The state is only a starting point, never a fact: every decision still reads what the log holds
after it and appends expecting the aggregate's real last sequence, so a stale or missing start
costs a longer read, never a wrong decision. That is why replicas may each keep their own: one
in memory (bounded, least recently used first out) and, when a service gives a store, one in a
KV bucket for the next process, written when a read was long.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import structlog

from events.errors import StoreUnavailable
from events.store import Recorded
from services.reconciler.pure.view import ProxyState, fold
from services.runtime.eventlog.snapshots import SnapshotStore

log = structlog.get_logger("egress.reconciler")

STATES_BUCKET = "egress-reconciler-states"
"""The KV bucket of the states the reconciler folds on from, for its next process."""
CACHED = 20_000
"""States kept in memory: a fleet of that size decides from memory (about 1 KB each)."""
PERSIST_AFTER = 64
"""Events read past the start after which the state is also written to the store."""


@dataclass
class States:
    store: SnapshotStore[ProxyState] | None = None
    size: int = CACHED
    persist_after: int = PERSIST_AFTER
    _states: OrderedDict[str, tuple[ProxyState, int]] = field(default_factory=OrderedDict)

    async def start(self, uid: str) -> tuple[ProxyState, int]:
        """The state to fold on from and the sequence it is complete as of (0: from nothing)."""
        hit = self._states.get(uid)
        if hit is not None:
            self._states.move_to_end(uid)
            return hit
        if self.store is not None:
            try:
                got = await self.store.get(uid)
            except StoreUnavailable as exc:
                log.warning("no stored state, folding the whole history", uid=uid, error=str(exc))
                got = None
            if got is not None and got[0].uid == uid:
                return got
        return ProxyState(uid=uid), 0

    def chain(self, uid: str, recorded: Recorded, after: int | None) -> bool:
        """Fold ``recorded`` onto the kept state when it provably comes right after it: its
        append expected the proxy's last sequence to be ``after`` and the server checked that
        (``codec.expected_last``), and the kept state is complete as of ``after`` (0: the
        event is the proxy's first). The kept state is then complete as of the event, and no
        read was needed. True when it was folded."""
        if after is None:
            return False
        hit = self._states.get(uid)
        if hit is not None and hit[1] >= recorded.seq:
            return False  # already past it (a redelivery, or a read got there first)
        if after == 0:
            start = ProxyState(uid=uid)
        elif hit is not None and hit[1] == after:
            start = hit[0]
        else:
            return False
        self._remember(uid, fold(uid, [recorded], start), recorded.seq)
        return True

    def exactly(self, uid: str, seq: int) -> ProxyState | None:
        """The kept state if it is complete as of exactly ``seq``."""
        hit = self._states.get(uid)
        return hit[0] if hit is not None and hit[1] == seq else None

    async def keep(self, uid: str, state: ProxyState, as_of: int, read: int) -> None:
        """Remember ``state`` as of ``as_of``; ``read``: how many events it took to get there.
        A state kept as of a later sequence stays (two reconciles of one proxy may overlap)."""
        hit = self._states.get(uid)
        if hit is None or hit[1] <= as_of:
            self._remember(uid, state, as_of)
        if self.store is not None and read >= self.persist_after:
            try:
                await self.store.put(uid, state, as_of)
            except StoreUnavailable as exc:
                log.warning("state not stored; the next process reads more", uid=uid, error=exc)

    def _remember(self, uid: str, state: ProxyState, as_of: int) -> None:
        self._states[uid] = (state, as_of)
        self._states.move_to_end(uid)
        while len(self._states) > self.size:
            self._states.popitem(last=False)

    def forget(self, uid: str) -> None:
        self._states.pop(uid, None)
